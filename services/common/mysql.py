"""PyMySQL connections that share one TLS context per process.

Given no TLS options, PyMySQL (2.x) connects in "preferred" mode: TLS if the server offers
it, plain otherwise, the server's certificate unverified. It still builds a new
``ssl.create_default_context()`` for every connection, which loads the system's CA bundle, only
for a mode that never verifies against it: 37 ms of CPU per connection here (0.5 ms without),
paid by every pool that grows, every NullPool checkout, every test and CLI. :func:`install`
makes every SQLAlchemy engine's PyMySQL connections in that mode share one context (an
``SSLContext`` may wrap any number of sockets, from any thread). Connections given TLS options
(``connect_args={"ssl": ...}`` and the like) build theirs as PyMySQL does.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any

import pymysql.connections
import sqlalchemy as sa
from sqlalchemy import event

_lock = threading.Lock()
_preferred: ssl.SSLContext | None = None
_installed = False


class Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """PyMySQL's connection, with the preferred mode's TLS context made once per process."""

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        global _preferred
        if not isinstance(sslp, dict) or sslp:  # explicit options: PyMySQL's own context
            return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]
        with _lock:
            if _preferred is None:
                _preferred = super()._create_ssl_ctx(sslp)
            return _preferred


def _do_connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> Any:
    if dialect.driver == "pymysql":
        return Connection(*cargs, **cparams)
    return None  # any other driver connects as it would


def install() -> None:
    """Connect every engine's PyMySQL connections through :class:`Connection`. Idempotent."""
    global _installed
    with _lock:
        if not _installed:
            event.listen(sa.engine.Engine, "do_connect", _do_connect)
            _installed = True
