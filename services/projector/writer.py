"""Applies row operations on one connection, batching runs of the same shape into one statement.

Inserts and upserts of the same table and columns become one multi-row statement (PyMySQL
rewrites executemany of INSERT ... VALUES into one statement) unless another kind of write to
the same table comes between them. Increments are
merged by key and written together whenever the writer flushes: before the handler reads state,
and at the end of the batch. Other updates and deletes run in order.

Updates of one row of ``jobs`` or ``attempts`` by primary key (what execution events do, several
times per job) are *deferred*: merged per row (later values win) and written at the end of the
flush, rows with the same columns together in one ``UPDATE ... JOIN (SELECT ... UNION ALL ...)``
statement. That is the same result as running them in order, because an operation emitted later
that could touch one of those rows (an insert of its key, an ``UpdateIn`` naming it, any delete
of the table) first turns the deferred updates of its table back into ordinary ones, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from core.projection.ops import (
    Delete,
    Increment,
    Increments,
    InsertIgnore,
    Op,
    Row,
    Update,
    UpdateIn,
    Upsert,
    Value,
)

IN_CHUNK = 5_000
BULK_CHUNK = 500
DEFERRED_KEYS: dict[str, tuple[str, ...]] = {
    "jobs": ("batch_id", "job_id"),
    "attempts": ("batch_id", "job_id", "attempt_id"),
}
"""Tables whose single-row updates by primary key are deferred and merged (see above)."""
_SMALL_IN = 16
"""An ``UpdateIn`` of at most this many primary keys is deferred as that many row updates; a
bigger one (a commit's) stays one ``IN`` statement."""


def _q(name: str) -> str:
    return f"`{name}`"


def _cols(columns: Iterable[str]) -> str:
    return ", ".join(_q(c) for c in columns)


def _p(name: str) -> str:
    """A named placeholder in the driver's own style (PyMySQL: pyformat)."""
    return f"%({name})s"


def _values(columns: Sequence[str]) -> str:
    return ", ".join(_p(c) for c in columns)


class Writer:
    """Buffers operations and applies them on ``conn`` (inside the caller's transaction)."""

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn
        self._pending: list[Op] = []
        self._increments = Increments()
        self._deferred: dict[str, dict[tuple[Value, ...], dict[str, Value]]] = {}
        self.statements = 0

    def emit(self, ops: Iterable[Op]) -> None:
        for op in ops:
            if isinstance(op, Increment):
                self._increments.add(op)
                continue
            keys = DEFERRED_KEYS.get(op.table)
            if keys is not None:
                if isinstance(op, Update) and len(op.where) == len(keys) and all(
                        k in op.where for k in keys):
                    row = tuple(op.where[k] for k in keys)
                    self._deferred.setdefault(op.table, {}).setdefault(row, {}).update(op.values)
                    continue
                if (isinstance(op, UpdateIn) and len(op.values_in) <= _SMALL_IN
                        and len(op.where) + 1 == len(keys)
                        and set(op.where) | {op.column} == set(keys)):
                    # A few rows by primary key (children released by one job's end): the
                    # same as that many single-row updates, so they merge like those.
                    deferred = self._deferred.setdefault(op.table, {})
                    for i in op.values_in:
                        row = tuple(i if k == op.column else op.where[k] for k in keys)
                        deferred.setdefault(row, {}).update(op.values)
                    continue
                if self._touches_deferred(op, keys):
                    self._undefer(op.table)
            self._pending.append(op)

    def _touches_deferred(self, op: Op, keys: tuple[str, ...]) -> bool:
        deferred = self._deferred.get(op.table)
        if not deferred:
            return False
        match op:
            case InsertIgnore(rows=rows) | Upsert(rows=rows):
                return any(tuple(r.get(k) for k in keys) in deferred for r in rows)
            case UpdateIn(where=where, column=column, values_in=ids) if (
                    set(where) | {column} == set(keys)):
                return any(tuple(where[k] if k != column else i for k in keys) in deferred
                           for i in ids)
            case _:
                return True

    def _undefer(self, table: str) -> None:
        """Turn the deferred updates of ``table`` back into ordinary ones, in order."""
        keys = DEFERRED_KEYS[table]
        for row, values in self._deferred.pop(table, {}).items():
            self._pending.append(Update(table, values, dict(zip(keys, row, strict=True))))

    def flush(self) -> None:
        """Apply everything buffered. Call before reading state the buffered ops may change."""
        pending, self._pending = self._pending, []
        # Open runs of inserts/upserts by shape. Tables have no foreign keys, so writes to
        # different tables commute: only a write of another shape to the same table closes a run.
        runs: dict[tuple[object, ...], list[InsertIgnore | Upsert]] = {}
        for op in pending:
            shape = _shape(op) if isinstance(op, InsertIgnore | Upsert) else None
            for other in [k for k in runs if k[0] == op.table and k != shape]:
                self._write_run(runs.pop(other))
            if isinstance(op, InsertIgnore | Upsert):
                if op.rows:
                    runs.setdefault(_shape(op), []).append(op)
            else:
                self._write(op)
        for run in runs.values():
            self._write_run(run)
        # Increments of one table and key columns go in one statement whatever columns they
        # move: a column a row does not move is added 0 (counter columns default to 0).
        by_table: dict[tuple[str, tuple[str, ...]], list[Increment]] = {}
        for inc in self._increments.drain():
            by_table.setdefault((inc.table, tuple(inc.key)), []).append(inc)
        for (table, keys), incs in by_table.items():
            deltas = tuple(dict.fromkeys(c for inc in incs for c in inc.deltas))
            rows = [{**inc.key, **{d: inc.deltas.get(d, 0) for d in deltas}} for inc in incs]
            cols = keys + deltas
            sets = ", ".join(f"{_q(d)} = {_q(d)} + VALUES({_q(d)})" for d in deltas)
            self._exec(f"INSERT INTO {_q(table)} ({_cols(cols)}) VALUES ({_values(cols)}) "
                       f"ON DUPLICATE KEY UPDATE {sets}", rows)
        deferred, self._deferred = self._deferred, {}
        for table, updates in deferred.items():
            by_columns: dict[tuple[str, ...], list[tuple[tuple[Value, ...], Row]]] = {}
            for row, values in updates.items():
                by_columns.setdefault(tuple(values), []).append((row, values))
            for columns, rows_ in by_columns.items():
                self._bulk_update(table, DEFERRED_KEYS[table], columns, rows_)

    def _bulk_update(self, table: str, keys: tuple[str, ...], columns: tuple[str, ...],
                     rows: Sequence[tuple[tuple[Value, ...], Row]]) -> None:
        """Set ``columns`` of many rows, each to its own values, in few statements."""
        if len(rows) == 1:
            row, values = rows[0]
            self._write(Update(table, values, dict(zip(keys, row, strict=True))))
            return
        names = keys + columns
        on = " AND ".join(f"t.{_q(k)} = u.{_q(k)}" for k in keys)
        sets = ", ".join(f"t.{_q(c)} = u.{_q(c)}" for c in columns)
        for start in range(0, len(rows), BULK_CHUNK):
            chunk = rows[start:start + BULK_CHUNK]
            params: dict[str, Value] = {}
            selects = []
            for i, (row, values) in enumerate(chunk):
                items = [*row, *(values[c] for c in columns)]
                parts = []
                for n, (name, value) in enumerate(zip(names, items, strict=True)):
                    params[f"p{i}_{n}"] = value
                    parts.append(f"{_p(f'p{i}_{n}')} AS {_q(name)}" if i == 0
                                 else _p(f"p{i}_{n}"))
                selects.append("SELECT " + ", ".join(parts))
            self._exec(f"UPDATE {_q(table)} AS t JOIN ({' UNION ALL '.join(selects)}) AS u "
                       f"ON {on} SET {sets}", params)

    def _exec(self, sql: str, params: Sequence[Row] | Row) -> None:
        # Straight to the driver: these statements are built here, with placeholders in the
        # driver's style, so SQLAlchemy's text parsing and caching would only add time.
        if isinstance(params, Sequence):
            self._conn.exec_driver_sql(sql, [dict(p) for p in params])
        else:
            self._conn.exec_driver_sql(sql, dict(params))
        self.statements += 1

    def _write_run(self, run: Sequence[InsertIgnore | Upsert]) -> None:
        if not run:
            return
        rows = [row for op in run for row in op.rows]
        if not rows:
            return
        first = run[0]
        cols = tuple(rows[0])
        if isinstance(first, Upsert):
            sets = ", ".join(f"{_q(c)} = VALUES({_q(c)})" for c in first.update)
        else:  # a no-op update ignores duplicates only (INSERT IGNORE would hide other errors)
            sets = f"{_q(cols[0])} = {_q(cols[0])}"
        self._exec(f"INSERT INTO {_q(first.table)} ({_cols(cols)}) VALUES ({_values(cols)}) "
                   f"ON DUPLICATE KEY UPDATE {sets}", rows)

    def _write(self, op: Op) -> None:
        match op:
            case Update(table=table, values=values, where=where):
                sets = ", ".join(f"{_q(c)} = {_p(f'v_{c}')}" for c in values)
                conds = " AND ".join(f"{_q(c)} = {_p(f'w_{c}')}" for c in where)
                self._exec(f"UPDATE {_q(table)} SET {sets} WHERE {conds}",
                           {**{f"v_{k}": v for k, v in values.items()},
                            **{f"w_{k}": v for k, v in where.items()}})
            case UpdateIn(table=table, values=values, where=where, column=column,
                          values_in=ids):
                sets = ", ".join(f"{_q(c)} = {_p(f'v_{c}')}" for c in values)
                conds = " AND ".join(f"{_q(c)} = {_p(f'w_{c}')}" for c in where)
                params: dict[str, object] = {**{f"v_{k}": v for k, v in values.items()},
                                             **{f"w_{k}": v for k, v in where.items()}}
                sql = (f"UPDATE {_q(table)} SET {sets} WHERE {conds} "
                       f"AND {_q(column)} IN {_p('ids')}")  # a tuple expands to (a, b, ...)
                for i in range(0, len(ids), IN_CHUNK):
                    self._conn.exec_driver_sql(sql, {**params, "ids": tuple(ids[i:i + IN_CHUNK])})
                    self.statements += 1
            case Delete(table=table, where=where):
                conds = " AND ".join(f"{_q(c)} = {_p(c)}" for c in where)
                self._exec(f"DELETE FROM {_q(table)} WHERE {conds}", where)
            case _:
                raise TypeError(f"unexpected operation {op!r}")


def _shape(op: InsertIgnore | Upsert) -> tuple[object, ...]:
    """Ops of one shape become one multi-row statement (the table comes first)."""
    columns = tuple(op.rows[0]) if op.rows else ()
    return (op.table, type(op).__name__, columns,
            op.update if isinstance(op, Upsert) else ())
