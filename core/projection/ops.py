"""Row operations: what the projector's pure code asks the sink to do.

Operations are plain data naming a table and columns, never SQL. The sink turns a run of
operations of the same shape into one multi-row statement, so a bunch of 1,024 jobs is one
INSERT, not 1,024. Counter increments on the same key merge by addition; increments commute
with each other, so the sink may defer and merge them until it next reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TypeAlias

from core.billing import JobUsage

Value: TypeAlias = int | str | bool | JobUsage | None
"""A column's value. A :class:`core.billing.JobUsage` only in the rebuild's fold's job rows
(``resource_usage``), which its writers render (:mod:`services.audit`)."""
Row: TypeAlias = Mapping[str, Value]


@dataclass(frozen=True)
class InsertIgnore:
    """Insert rows; a row whose key exists is left as it is (idempotent re-submission)."""

    table: str
    rows: Sequence[Row]


@dataclass(frozen=True)
class Upsert:
    """Insert rows, or set ``update`` columns of an existing row to the new row's values."""

    table: str
    rows: Sequence[Row]
    update: tuple[str, ...]


@dataclass(frozen=True)
class Update:
    """Set columns of the rows matching ``where`` (equality on every key)."""

    table: str
    values: Row
    where: Row


@dataclass(frozen=True)
class UpdateIn:
    """Set columns of the rows matching ``where`` whose ``column`` is one of ``values_in``.

    One statement for many rows that get the same values (a commit sets a few distinct
    (state, pending parents) combinations on thousands of jobs). With string values it is also
    a guard: an instance event changes the row only while its state is one of ``values_in``.
    """

    table: str
    values: Row
    where: Row
    column: str
    values_in: Sequence[int] | Sequence[str]


@dataclass(frozen=True)
class Increment:
    """Add ``deltas`` to the counters of the row with ``key`` (created at zero if missing)."""

    table: str
    key: Row
    deltas: Mapping[str, int]


@dataclass(frozen=True)
class Delete:
    """Delete the rows matching ``where``."""

    table: str
    where: Row


Op: TypeAlias = InsertIgnore | Upsert | Update | UpdateIn | Increment | Delete


@dataclass
class Increments:
    """Increments merged by (table, key): many state changes become one row write each.

    :meth:`add` keys by the key's items in the order the op gives them (every op constructor
    names a table's key columns in one order), which costs no sort per op; :meth:`drain` puts
    the few distinct keys in canonical form, so a key given in two orders still merges into
    one row.
    """

    _by_key: dict[tuple[str, tuple[tuple[str, Value], ...]], dict[str, int]] = field(
        default_factory=dict)

    def add(self, op: Increment) -> None:
        """Merge ``op`` into the pending increments."""
        key = (op.table, tuple(op.key.items()))
        merged = self._by_key.get(key)
        if merged is None:
            self._by_key[key] = dict(op.deltas)
            return
        for column, delta in op.deltas.items():
            merged[column] = merged.get(column, 0) + delta

    def bump(self, table: str, key: tuple[tuple[str, Value], ...], column: str,
             delta: int) -> None:
        """Add ``delta`` to ``column`` of the row with ``key`` (an Increment's key items).

        What :meth:`add` does for one Increment, without building one (the billing hot path).
        """
        merged = self._by_key.get((table, key))
        if merged is None:
            self._by_key[(table, key)] = {column: delta}
        else:
            merged[column] = merged.get(column, 0) + delta

    def drain(self) -> list[Increment]:
        """The merged increments (zero deltas dropped), in a stable order; then empty."""
        canonical: dict[tuple[str, tuple[tuple[str, Value], ...]], dict[str, int]] = {}
        for (table, items), deltas in self._by_key.items():
            row = (table, tuple(sorted(items)))
            merged = canonical.get(row)
            if merged is None:
                canonical[row] = deltas
                continue
            for column, delta in deltas.items():
                merged[column] = merged.get(column, 0) + delta
        self._by_key.clear()
        rows = list(canonical.items())
        try:  # a stable order for the writes (and their row locks): table, then key
            rows.sort(key=itemgetter(0))
        except TypeError:  # a key column holding values of two types (None and a string)
            rows.sort(key=lambda kv: repr(kv[0]))
        out = []
        for (table, key), deltas in rows:
            nonzero = {c: d for c, d in deltas.items() if d != 0}
            if nonzero:
                out.append(Increment(table, dict(key), nonzero))
        return out

    def __len__(self) -> int:
        return len(self._by_key)


def merge_increments(ops: Iterable[Increment]) -> list[Increment]:
    """Merge increments on the same (table, key) by adding their deltas."""
    acc = Increments()
    for op in ops:
        acc.add(op)
    return acc.drain()
