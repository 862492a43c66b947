"""Merging counter increments: the merged ops add up to exactly what the ops they replace add."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from core.projection.ops import Increment, Increments, merge_increments

TABLES = ("t1", "t2")
KEY_COLUMNS = ("batch_id", "job_group_id", "token")


@st.composite
def increments(draw: st.DrawFn) -> Increment:
    table = draw(st.sampled_from(TABLES))
    values = {"batch_id": draw(st.integers(1, 3)), "job_group_id": draw(st.integers(0, 2)),
              "token": draw(st.sampled_from(["a", "b"]))}
    # Constructors may name a table's key columns in any order: the order must not matter.
    order = draw(st.permutations(KEY_COLUMNS))
    deltas = draw(st.dictionaries(st.sampled_from(["n_ready", "n_running", "cores"]),
                                  st.integers(-3, 3), min_size=1, max_size=3))
    return Increment(table, {c: values[c] for c in order}, deltas)


def totals(ops: list[Increment]) -> dict[tuple[object, ...], int]:
    """The non-zero total added to each (table, row, column)."""
    out: Counter[tuple[object, ...]] = Counter()
    for op in ops:
        for column, delta in op.deltas.items():
            out[(op.table, tuple(sorted(op.key.items())), column)] += delta
    return {k: v for k, v in out.items() if v != 0}


@given(st.lists(increments(), max_size=40))
def test_merged_increments_add_up_to_the_ops_they_replace(ops: list[Increment]) -> None:
    merged = merge_increments(ops)
    assert totals(merged) == totals(ops)


@given(st.lists(increments(), max_size=40))
def test_one_increment_per_row_whatever_order_the_key_was_given_in(ops: list[Increment]
                                                                   ) -> None:
    merged = merge_increments(ops)
    rows = [(op.table, tuple(sorted(op.key.items()))) for op in merged]
    assert len(rows) == len(set(rows))
    assert all(d != 0 for op in merged for d in op.deltas.values())


def test_drain_is_stable_and_empties() -> None:
    acc = Increments()
    acc.add(Increment("t", {"b": 1, "a": 2}, {"x": 1}))
    acc.add(Increment("t", {"a": 2, "b": 1}, {"x": 2, "y": 0}))
    acc.add(Increment("s", {"a": 1}, {"x": -1}))
    assert acc.drain() == [Increment("s", {"a": 1}, {"x": -1}),
                           Increment("t", {"a": 2, "b": 1}, {"x": 3})]
    assert acc.drain() == []
    assert len(acc) == 0


@given(st.lists(increments(), max_size=40))
def test_drain_orders_rows_by_table_then_key_whatever_the_arrival(ops: list[Increment]
                                                                  ) -> None:
    # One fixed order of writes, so two transactions lock shared rows in the same order.
    rows = [(op.table, tuple(sorted(op.key.items()))) for op in merge_increments(ops)]
    assert rows == sorted(rows)
    again = [(op.table, tuple(sorted(op.key.items()))) for op in merge_increments(ops[::-1])]
    assert again == rows


def test_drain_orders_a_key_column_of_mixed_types_too() -> None:
    acc = Increments()
    for value in ("x", None, 3, "a"):
        acc.add(Increment("t", {"k": value}, {"n": 1}))
    first = [op.key["k"] for op in acc.drain()]
    for value in (3, "a", None, "x"):
        acc.add(Increment("t", {"k": value}, {"n": 1}))
    assert [op.key["k"] for op in acc.drain()] == first
    assert sorted(map(repr, first)) == list(map(repr, first))
