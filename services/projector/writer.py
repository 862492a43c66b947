"""Applies row operations on one connection, batching runs of the same shape into one statement.

Inserts and upserts of the same table and columns that follow each other become one multi-row
statement (PyMySQL rewrites executemany of INSERT ... VALUES into one statement). Increments are
merged by key and written together whenever the writer flushes: before the handler reads state,
and at the end of the batch. Updates and deletes run in order.
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
)

IN_CHUNK = 5_000


def _q(name: str) -> str:
    return f"`{name}`"


def _cols(columns: Iterable[str]) -> str:
    return ", ".join(_q(c) for c in columns)


def _values(columns: Sequence[str]) -> str:
    return ", ".join(f":{c}" for c in columns)


class Writer:
    """Buffers operations and applies them on ``conn`` (inside the caller's transaction)."""

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn
        self._pending: list[Op] = []
        self._increments = Increments()
        self.statements = 0

    def emit(self, ops: Iterable[Op]) -> None:
        for op in ops:
            if isinstance(op, Increment):
                self._increments.add(op)
            else:
                self._pending.append(op)

    def flush(self) -> None:
        """Apply everything buffered. Call before reading state the buffered ops may change."""
        pending, self._pending = self._pending, []
        run: list[InsertIgnore | Upsert] = []
        for op in pending:
            if isinstance(op, InsertIgnore | Upsert) and run and _same_shape(run[-1], op):
                run.append(op)
                continue
            self._write_run(run)
            run = []
            if isinstance(op, InsertIgnore | Upsert):
                run = [op]
            else:
                self._write(op)
        self._write_run(run)
        increments = self._increments.drain()
        by_shape: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[Row]] = {}
        for inc in increments:
            shape = (inc.table, tuple(inc.key), tuple(inc.deltas))
            by_shape.setdefault(shape, []).append({**inc.key, **inc.deltas})
        for (table, keys, deltas), rows in by_shape.items():
            cols = keys + deltas
            sets = ", ".join(f"{_q(d)} = {_q(d)} + VALUES({_q(d)})" for d in deltas)
            self._exec(f"INSERT INTO {_q(table)} ({_cols(cols)}) VALUES ({_values(cols)}) "
                       f"ON DUPLICATE KEY UPDATE {sets}", rows)

    def _exec(self, sql: str, params: Sequence[Row] | Row) -> None:
        self._conn.execute(sa.text(sql), params)
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
                sets = ", ".join(f"{_q(c)} = :v_{c}" for c in values)
                conds = " AND ".join(f"{_q(c)} = :w_{c}" for c in where)
                self._exec(f"UPDATE {_q(table)} SET {sets} WHERE {conds}",
                           {**{f"v_{k}": v for k, v in values.items()},
                            **{f"w_{k}": v for k, v in where.items()}})
            case UpdateIn(table=table, values=values, where=where, column=column,
                          values_in=ids):
                sets = ", ".join(f"{_q(c)} = :v_{c}" for c in values)
                conds = " AND ".join(f"{_q(c)} = :w_{c}" for c in where)
                params = {**{f"v_{k}": v for k, v in values.items()},
                          **{f"w_{k}": v for k, v in where.items()}}
                stmt = sa.text(f"UPDATE {_q(table)} SET {sets} WHERE {conds} "
                               f"AND {_q(column)} IN :ids").bindparams(
                    sa.bindparam("ids", expanding=True))
                for i in range(0, len(ids), IN_CHUNK):
                    self._conn.execute(stmt, {**params, "ids": list(ids[i:i + IN_CHUNK])})
                    self.statements += 1
            case Delete(table=table, where=where):
                conds = " AND ".join(f"{_q(c)} = :{c}" for c in where)
                self._exec(f"DELETE FROM {_q(table)} WHERE {conds}", where)
            case _:
                raise TypeError(f"unexpected operation {op!r}")


def _same_shape(a: InsertIgnore | Upsert, b: InsertIgnore | Upsert) -> bool:
    if type(a) is not type(b) or a.table != b.table or not a.rows or not b.rows:
        return False
    if isinstance(a, Upsert) and isinstance(b, Upsert) and a.update != b.update:
        return False
    return tuple(a.rows[0]) == tuple(b.rows[0])
