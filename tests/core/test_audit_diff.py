"""The audit's pure parts: token sums, row diffs, key ranges (services/audit/diff.py)."""

from __future__ import annotations

import itertools
import random
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.audit.diff import (
    ABSENT,
    COLUMNS,
    ROW,
    TABLE,
    Difference,
    diff_keyed,
    diff_rows,
    diff_specs,
    format_difference,
    id_chunks,
    keyed,
    sum_tokens,
    table_spec,
)

JOBS = table_spec("jobs", ["batch_id", "job_id", "state", "spec"], ["batch_id", "job_id"])
USERS_RES = table_spec("user_inst_coll_resources",
                       ["user", "inst_coll", "token", "n_ready_jobs", "ready_cores_mcpu"],
                       ["user", "inst_coll", "token"])

# A tokenized table as rows: logical key (user, inst_coll) and two counters.
_keys = st.tuples(st.sampled_from(["alice", "bob", "carol"]), st.sampled_from(["std", "hi"]))
_counters = st.tuples(st.integers(-5, 5), st.integers(-5000, 5000))
_logical = st.dictionaries(_keys, _counters, max_size=6)


def test_specs_find_the_token_and_the_logical_key() -> None:
    assert USERS_RES.tokenized and USERS_RES.token == "token"
    assert USERS_RES.key == ("user", "inst_coll")
    assert USERS_RES.value_columns == ("n_ready_jobs", "ready_cores_mcpu")
    assert not JOBS.tokenized and JOBS.value_columns == ("state", "spec")
    batches = table_spec("batches", ["id", "token", "state"], ["id"])
    assert not batches.tokenized and batches.value_columns == ("token", "state")


def test_excluded_columns_are_not_compared() -> None:
    spec = table_spec("completions_outbox", ["batch_id", "job_group_id", "payload",
                                             "published_ms"], ["batch_id", "job_group_id"],
                      excluded_columns=["published_ms"])
    assert spec.columns == ("batch_id", "job_group_id", "payload")
    assert diff_rows(spec, [(1, 0, "x")], [(1, 0, "x")]) == []


def test_a_table_without_primary_key_is_keyed_by_its_rows() -> None:
    spec = table_spec("t", ["a", "b"], [])
    assert spec.key == ("a", "b") and spec.value_columns == ()
    (d,) = diff_rows(spec, [(1, 2)], [(1, 3)])[:1]
    assert d.column == ROW


@given(_logical, st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms())
def test_token_sums_do_not_depend_on_how_values_are_spread(
        logical: dict[tuple[str, str], tuple[int, int]], splits: list[int],
        rnd: random.Random) -> None:
    rows = []
    for i, (key, values) in enumerate(sorted(logical.items())):
        n = splits[i % len(splits)]
        parts = [[0] * len(values) for _ in range(n)]
        for c, v in enumerate(values):
            # Any split of v over n tokens: n-1 arbitrary parts, the last one makes the sum.
            for t in range(n - 1):
                parts[t][c] = rnd.randint(-9, 9)
            parts[n - 1][c] = v - sum(parts[t][c] for t in range(n - 1))
        rows += [(*key, t, *p) for t, p in enumerate(parts)]
    rnd.shuffle(rows)
    got = keyed(USERS_RES, rows)
    assert got == {k: v for k, v in logical.items() if any(v)}


@given(_logical)
def test_all_zero_sums_are_absent(logical: dict[tuple[str, str], tuple[int, int]]) -> None:
    rows: list[tuple[object, ...]] = [(*k, 0, *v) for k, v in logical.items()]
    rows += [(*k, 1, -a, -b) for k, (a, b) in logical.items()]
    assert keyed(USERS_RES, rows) == {}
    assert sum_tokens([(("u",), (0, None)), (("u",), (None, 0))]) == {}


def test_sum_tokens_adds_decimals_exactly() -> None:
    got = sum_tokens([(("p",), (Decimal("0.1"),)), (("p",), (Decimal("0.2"),))])
    assert got == {("p",): (Decimal("0.3"),)}


_rows = st.dictionaries(st.tuples(st.integers(1, 3), st.integers(1, 5)),
                        st.tuples(st.sampled_from(["Ready", "Running", "Success"]),
                                  st.sampled_from(["{}", "{\"a\":1}"])), max_size=8)


@given(_rows)
def test_a_table_equals_itself(rows: dict[tuple[int, int], tuple[str, str]]) -> None:
    flat = [(*k, *v) for k, v in rows.items()]
    assert diff_rows(JOBS, flat, list(reversed(flat))) == []


@given(_rows, _rows)
def test_differences_are_exactly_the_keys_and_columns_that_differ(
        live: dict[tuple[int, int], tuple[str, str]],
        rebuilt: dict[tuple[int, int], tuple[str, str]]) -> None:
    diffs = diff_keyed(JOBS, live, rebuilt)
    expected = set()
    for key in live.keys() | rebuilt.keys():
        if key not in live or key not in rebuilt:
            expected.add((key, ROW))
        else:
            expected |= {(key, c) for c, a, b in zip(JOBS.value_columns, live[key],
                                                     rebuilt[key], strict=True) if a != b}
    assert {(tuple(v for _, v in d.key), d.column) for d in diffs} == expected
    assert [d.key for d in diffs] == sorted(d.key for d in diffs)
    for d in diffs:
        key = tuple(v for _, v in d.key)
        if d.column == ROW:
            assert (d.live is ABSENT) == (key not in live)
            assert (d.rebuilt is ABSENT) == (key not in rebuilt)


def test_a_changed_column_and_rows_on_one_side_are_reported() -> None:
    live = [(1, 1, "Running", "{}"), (1, 2, "Ready", "{}")]
    rebuilt = [(1, 1, "Success", "{}"), (1, 3, "Ready", "{}")]
    assert diff_rows(JOBS, live, rebuilt) == [
        Difference("jobs", (("batch_id", 1), ("job_id", 1)), "state", "Running", "Success"),
        Difference("jobs", (("batch_id", 1), ("job_id", 2)), ROW,
                   {"state": "Ready", "spec": "{}"}, ABSENT),
        Difference("jobs", (("batch_id", 1), ("job_id", 3)), ROW,
                   ABSENT, {"state": "Ready", "spec": "{}"}),
    ]


def test_a_changed_token_row_changes_the_logical_sum() -> None:
    live = [("alice", "std", 0, 1, 1000), ("alice", "std", 3, 1, 1000)]
    rebuilt = [("alice", "std", 1, 2, 2000), ("bob", "std", 1, 0, 0)]
    assert diff_rows(USERS_RES, live, rebuilt) == []
    assert diff_rows(USERS_RES, live, [("alice", "std", 1, 2, 1999)]) == [
        Difference("user_inst_coll_resources", (("user", "alice"), ("inst_coll", "std")),
                   "ready_cores_mcpu", 2000, 1999)]


def test_schema_differences() -> None:
    other_jobs = table_spec("jobs", ["batch_id", "job_id", "state"], ["batch_id", "job_id"])
    diffs = diff_specs({"jobs": JOBS, "users": USERS_RES}, {"jobs": other_jobs,
                                                             "extra": JOBS})
    assert [(d.table, d.column) for d in diffs] == [
        ("extra", TABLE), ("jobs", COLUMNS), ("users", TABLE)]
    assert diffs[0].live is ABSENT and diffs[2].rebuilt is ABSENT


@pytest.mark.parametrize(("d", "line"), [
    (Difference("jobs", (("batch_id", 1), ("job_id", 2)), "state", "Running", "Ready"),
     "jobs  batch_id=1 job_id=2  state  live='Running'  rebuilt='Ready'"),
    (Difference("jobs", (("batch_id", 1), ("job_id", 2)), ROW, {"state": "Ready"}, ABSENT),
     "jobs  batch_id=1 job_id=2  *  live={state='Ready'}  rebuilt=<absent>"),
    (Difference("extra", (), TABLE, ABSENT, "present"),
     "extra  -  (table)  live=<absent>  rebuilt='present'"),
], ids=["column", "row", "table"])
def test_format_difference(d: Difference, line: str) -> None:
    assert format_difference(d) == line


def test_format_truncates_long_values() -> None:
    d = Difference("jobs", (("batch_id", 1),), "spec", "x" * 500, "y")
    assert len(format_difference(d, limit=50)) < 120


@given(st.integers(-10, 10_000), st.integers(0, 20_000), st.integers(0, 100_000),
       st.integers(1, 50_000))
def test_id_chunks_cover_the_range_once_in_order(lo: int, width: int, n_rows: int,
                                                 target: int) -> None:
    hi = lo + width
    chunks = list(id_chunks(lo, hi, n_rows, target))
    assert chunks[0][0] == lo and chunks[-1][1] == hi
    assert all(a <= b for a, b in chunks)
    assert all(b + 1 == c for (_, b), (c, _) in itertools.pairwise(chunks))
    assert len(chunks) <= max(1, -(-max(n_rows, 1) // target))


def test_id_chunks_of_an_empty_range() -> None:
    assert list(id_chunks(5, 4, 0, 10)) == []
