"""Reading projection tables of two databases and diffing them (the I/O around :mod:`.diff`).

Both databases live on the same server, so tables are named ``schema.table`` and either
connection can read them; the live side is read on a connection that holds a consistent
snapshot (see :mod:`services.audit.rebuild`).

What is compared: every base table of the live database except the bookkeeping below, which is
not a projection of the log (a replay cannot and need not reproduce it):

- ``applied_offsets``: which offsets each consumer applied, with wall-clock update times;
- ``id_sequences``: ingest's id allocation (written by ingest, not the projector);
- ``schema_migrations``: which migrations ran, and when;
- ``callback_deliveries``: the callback dispatcher's delivery state (attempts, retry times);
- the column ``completions_outbox.published_ms``: when the outbox relay published a row.

Tables with a ``token`` column in their primary key are compared by logical key, summed over
tokens (a zero sum is a missing row). Large tables are read in ranges of their first key column
when it is an integer, so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from services.audit.diff import Difference, TableSpec, diff_rows, diff_specs, id_chunks, table_spec

EXCLUDED_TABLES: dict[str, str] = {
    "applied_offsets": "consumer positions (tracking records), with wall-clock times",
    "id_sequences": "ingest's id allocation, not written by the projector",
    "schema_migrations": "migration bookkeeping, with the time each ran",
    "callback_deliveries": "the callback dispatcher's delivery state",
}
"""Tables that are not projections of the log, and why."""
EXCLUDED_COLUMNS: dict[tuple[str, str], str] = {
    ("completions_outbox", "published_ms"): "when the outbox relay published the row",
}
"""Columns that are not projections of the log, and why."""

CHUNK_ROWS = 50_000
_INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})

_COLUMNS = sa.text(
    "SELECT c.TABLE_NAME, c.COLUMN_NAME, c.DATA_TYPE FROM information_schema.COLUMNS c "
    "JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA "
    "AND t.TABLE_NAME = c.TABLE_NAME "
    "WHERE c.TABLE_SCHEMA = :s AND t.TABLE_TYPE = 'BASE TABLE' "
    "ORDER BY c.TABLE_NAME, c.ORDINAL_POSITION")
_PRIMARY = sa.text(
    "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
    "WHERE TABLE_SCHEMA = :s AND CONSTRAINT_NAME = 'PRIMARY' "
    "ORDER BY TABLE_NAME, ORDINAL_POSITION")


def _q(*names: str) -> str:
    for n in names:
        if "`" in n:
            raise ValueError(f"bad identifier {n!r}")
    return ".".join(f"`{n}`" for n in names)


def load_specs(conn: sa.Connection, schema: str) -> tuple[dict[str, TableSpec], set[str]]:
    """The compared tables of ``schema`` and the names of those keyed by an integer first."""
    columns: dict[str, list[str]] = {}
    types: dict[tuple[str, str], str] = {}
    for table, column, data_type in conn.execute(_COLUMNS, {"s": schema}):
        columns.setdefault(str(table), []).append(str(column))
        types[(str(table), str(column))] = str(data_type).lower()
    primary: dict[str, list[str]] = {}
    for table, column in conn.execute(_PRIMARY, {"s": schema}):
        primary.setdefault(str(table), []).append(str(column))
    specs: dict[str, TableSpec] = {}
    integer_first: set[str] = set()
    for table, cols in columns.items():
        if table in EXCLUDED_TABLES:
            continue
        excluded = [c for (t, c) in EXCLUDED_COLUMNS if t == table]
        spec = table_spec(table, cols, primary.get(table, []), excluded)
        specs[table] = spec
        if spec.key and types.get((table, spec.key[0])) in _INTEGER_TYPES:
            integer_first.add(table)
    return specs, integer_first


def _select(schema: str, spec: TableSpec, ranged: bool) -> sa.TextClause:
    cols = ", ".join(_q(c) for c in spec.columns)
    where = f" WHERE {_q(spec.key[0])} BETWEEN :lo AND :hi" if ranged else ""
    return sa.text(f"SELECT {cols} FROM {_q(schema, spec.name)}{where}")


def _extent(conn: sa.Connection, schema: str, spec: TableSpec) -> tuple[Any, Any, int]:
    first = _q(spec.key[0])
    lo, hi, n = conn.execute(sa.text(
        f"SELECT MIN({first}), MAX({first}), COUNT(*) FROM {_q(schema, spec.name)}")).one()
    return lo, hi, int(n)


def diff_table(live: sa.Connection, live_schema: str, rebuilt: sa.Connection,
               rebuilt_schema: str, spec: TableSpec, *, integer_first: bool,
               chunk_rows: int = CHUNK_ROWS) -> Iterator[Difference]:
    """The differences of one table, read whole or in ranges of its first key column."""
    if not integer_first:
        yield from diff_rows(spec, live.execute(_select(live_schema, spec, False)),
                             rebuilt.execute(_select(rebuilt_schema, spec, False)))
        return
    (lo_a, hi_a, n_a), (lo_b, hi_b, n_b) = (_extent(live, live_schema, spec),
                                            _extent(rebuilt, rebuilt_schema, spec))
    bounds = [v for v in (lo_a, hi_a, lo_b, hi_b) if v is not None]
    if not bounds:
        return
    live_q, rebuilt_q = _select(live_schema, spec, True), _select(rebuilt_schema, spec, True)
    for lo, hi in id_chunks(int(min(bounds)), int(max(bounds)), max(n_a, n_b), chunk_rows):
        params = {"lo": lo, "hi": hi}
        yield from diff_rows(spec, live.execute(live_q, params),
                             rebuilt.execute(rebuilt_q, params))


class Comparison:
    """Every difference between the compared tables of two databases, table by table.

    Iterate it for the differences (schema differences first); ``tables`` then says how many
    tables were compared row by row.
    """

    def __init__(self, live: sa.Connection, live_schema: str, rebuilt: sa.Connection,
                 rebuilt_schema: str, *, chunk_rows: int = CHUNK_ROWS) -> None:
        self._args = (live, live_schema, rebuilt, rebuilt_schema)
        self._chunk_rows = chunk_rows
        self.tables = 0

    def __iter__(self) -> Iterator[Difference]:
        live, live_schema, rebuilt, rebuilt_schema = self._args
        live_specs, live_int = load_specs(live, live_schema)
        rebuilt_specs, _ = load_specs(rebuilt, rebuilt_schema)
        schema_diffs = diff_specs(live_specs, rebuilt_specs)
        yield from schema_diffs
        skip = {d.table for d in schema_diffs}
        for name in sorted(live_specs.keys() - skip):
            yield from diff_table(live, live_schema, rebuilt, rebuilt_schema, live_specs[name],
                                  integer_first=name in live_int, chunk_rows=self._chunk_rows)
            self.tables += 1
