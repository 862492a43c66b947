"""A session's escaping mode for tests that must hold in both."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa


@contextmanager
def escapes_mode(conn: sa.Connection, no_backslash_escapes: bool) -> Iterator[None]:
    """Inside, ``conn``'s session reads string literals without backslash escapes
    (``NO_BACKSLASH_ESCAPES``) if asked; after, as before. Call it outside any transaction
    the test rolls back: the mode is set and reset in transactions of its own."""
    if no_backslash_escapes:
        conn.exec_driver_sql("SET SESSION sql_mode = CONCAT(@@sql_mode, "
                             "',NO_BACKSLASH_ESCAPES')")
        conn.commit()
    try:
        yield
    finally:
        if no_backslash_escapes:
            conn.exec_driver_sql("SET SESSION sql_mode = "
                                 "REPLACE(@@sql_mode, 'NO_BACKSLASH_ESCAPES', '')")
            conn.commit()
