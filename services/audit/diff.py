"""Comparing projection tables row by row: pure functions, no I/O.

A table is described by a :class:`TableSpec` (its compared columns, its key, and for a tokenized
table its token column). Rows are plain tuples in the spec's column order, as a database driver
returns them. :func:`keyed` turns rows into ``{key: values}``; for a tokenized table it sums the
token rows of each logical key (:func:`sum_tokens`), so two databases that spread a counter over
different token rows, or that kept a row whose counters net to zero, compare equal.
:func:`diff_keyed` lists every difference between two keyed tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

Value: TypeAlias = Any
"""A column value as the driver returns it (int, str, Decimal, date, bytes or None)."""
Key: TypeAlias = tuple[Value, ...]
Values: TypeAlias = tuple[Value, ...]

TOKEN_COLUMN = "token"
"""The column that spreads a tokenized counter over rows (sql/004-counters.sql)."""
ROW = "*"
"""The column of a difference about a whole row (present on one side only)."""
TABLE = "(table)"
"""The column of a difference about a whole table (present in one database only)."""
COLUMNS = "(columns)"
"""The column of a difference about a table's columns or key."""


class _Absent:
    """Marks the side of a difference where a row or table does not exist."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


@dataclass(frozen=True)
class TableSpec:
    """What to compare of one table.

    ``columns`` are the compared columns in table order (excluded columns already removed);
    ``key`` the logical key (the primary key, less the token column of a tokenized table).
    """

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    token: str | None = None
    value_columns: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        skip = {*self.key, *((self.token,) if self.token else ())}
        object.__setattr__(self, "value_columns",
                           tuple(c for c in self.columns if c not in skip))

    @property
    def tokenized(self) -> bool:
        return self.token is not None


def table_spec(name: str, columns: Sequence[str], primary_key: Sequence[str],
               excluded_columns: Iterable[str] = ()) -> TableSpec:
    """The spec of a table from its columns and primary key.

    A table whose primary key includes a ``token`` column is tokenized. A table without a primary
    key is keyed by all its compared columns (its rows are then only present or absent).
    """
    excluded = set(excluded_columns)
    compared = tuple(c for c in columns if c not in excluded)
    pk = tuple(c for c in primary_key if c not in excluded)
    token = TOKEN_COLUMN if TOKEN_COLUMN in pk else None
    key = tuple(c for c in pk if c != token) if pk else compared
    return TableSpec(name, compared, key, token)


@dataclass(frozen=True)
class Difference:
    """One difference: ``column`` of the row with ``key`` in ``table`` differs.

    ``column`` is :data:`ROW` when the row exists on one side only (the other side's value is
    the row's values by column), :data:`TABLE` or :data:`COLUMNS` for schema differences.
    """

    table: str
    key: tuple[tuple[str, Value], ...]
    column: str
    live: Value
    rebuilt: Value


def sum_tokens(rows: Iterable[tuple[Key, Sequence[Value]]]) -> dict[Key, Values]:
    """Sum token rows per logical key; keys whose sums are all zero are absent.

    Args:
        rows: (logical key, counter values) per token row; values are numbers (or None, as 0).

    Returns:
        The summed counters of each logical key with at least one non-zero sum.
    """
    sums: dict[Key, list[Value]] = {}
    for key, values in rows:
        acc = sums.get(key)
        if acc is None:
            sums[key] = [v or 0 for v in values]
        else:
            for i, v in enumerate(values):
                acc[i] += v or 0
    return {k: tuple(v) for k, v in sums.items() if any(x != 0 for x in v)}


def keyed(spec: TableSpec, rows: Iterable[Sequence[Value]]) -> dict[Key, Values]:
    """Rows (tuples in ``spec.columns`` order) as ``{logical key: values}``.

    Tokenized tables are summed over their token rows (:func:`sum_tokens`).
    """
    index = {c: i for i, c in enumerate(spec.columns)}
    key_idx = [index[c] for c in spec.key]
    value_idx = [index[c] for c in spec.value_columns]
    pairs = ((tuple(r[i] for i in key_idx), tuple(r[i] for i in value_idx)) for r in rows)
    if spec.tokenized:
        return sum_tokens(pairs)
    return dict(pairs)


def _sort_key(key: Key) -> tuple[tuple[bool, str, Value], ...]:
    # Primary key columns are NOT NULL and of one type per position; the type name only keeps
    # sorting total if a caller mixes types anyway.
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in key)


def diff_keyed(spec: TableSpec, live: Mapping[Key, Values], rebuilt: Mapping[Key, Values]
               ) -> list[Difference]:
    """Every difference between two keyed tables, ordered by key and column.

    A row on one side only is one :data:`ROW` difference; a row on both sides yields one
    difference per column whose values differ.
    """
    out: list[Difference] = []
    for key in sorted(live.keys() | rebuilt.keys(), key=_sort_key):
        named = tuple(zip(spec.key, key, strict=True))
        a, b = live.get(key), rebuilt.get(key)
        if a is None or b is None:
            out.append(Difference(spec.name, named, ROW,
                                  ABSENT if a is None else dict(zip(spec.value_columns, a,
                                                                    strict=True)),
                                  ABSENT if b is None else dict(zip(spec.value_columns, b,
                                                                    strict=True))))
            continue
        for column, x, y in zip(spec.value_columns, a, b, strict=True):
            if x != y:
                out.append(Difference(spec.name, named, column, x, y))
    return out


def diff_rows(spec: TableSpec, live: Iterable[Sequence[Value]],
              rebuilt: Iterable[Sequence[Value]]) -> list[Difference]:
    """Every difference between two tables given as rows in ``spec.columns`` order."""
    return diff_keyed(spec, keyed(spec, live), keyed(spec, rebuilt))


def diff_specs(live: Mapping[str, TableSpec], rebuilt: Mapping[str, TableSpec]
               ) -> list[Difference]:
    """Schema differences: tables in one database only, or with other columns or keys."""
    out: list[Difference] = []
    for name in sorted(live.keys() | rebuilt.keys()):
        a, b = live.get(name), rebuilt.get(name)
        if a is None or b is None:
            out.append(Difference(name, (), TABLE, "present" if a else ABSENT,
                                  "present" if b else ABSENT))
        elif (a.columns, a.key, a.token) != (b.columns, b.key, b.token):
            out.append(Difference(name, (), COLUMNS, _shape(a), _shape(b)))
    return out


def _shape(spec: TableSpec) -> str:
    token = f" token={spec.token}" if spec.token else ""
    return f"columns={list(spec.columns)} key={list(spec.key)}{token}"


def id_chunks(lo: int, hi: int, n_rows: int, target_rows: int) -> Iterator[tuple[int, int]]:
    """Inclusive ranges covering ``[lo, hi]``, each expected to hold about ``target_rows`` rows.

    Assumes rows spread evenly over the range; a denser range only makes a bigger chunk. Every
    integer of ``[lo, hi]`` is in exactly one range, in increasing order.
    """
    if hi < lo:
        return
    span = hi - lo + 1
    n_chunks = max(1, math.ceil(max(n_rows, 1) / max(target_rows, 1)))
    step = max(1, math.ceil(span / n_chunks))
    start = lo
    while start <= hi:
        end = min(hi, start + step - 1)
        yield start, end
        start = end + 1


def _show(value: Value, limit: int) -> str:
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{k}={_show(v, limit)}" for k, v in value.items()) + "}"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def format_difference(d: Difference, *, limit: int = 200) -> str:
    """One line: table, key, column, live value, rebuilt value (long values truncated)."""
    key = " ".join(f"{k}={v!r}" for k, v in d.key) or "-"
    return (f"{d.table}  {key}  {d.column}  live={_show(d.live, limit)}  "
            f"rebuilt={_show(d.rebuilt, limit)}")
