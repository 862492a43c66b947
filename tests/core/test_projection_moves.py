"""The projector's fast path for counter movements moves the same rows as ``move``."""

from __future__ import annotations

from typing import get_args

from hypothesis import given, settings
from hypothesis import strategies as st

from core.projection.counters import CANCELLABLE, JOB_COUNTS, USER_RESOURCES
from core.projection.execution import JobFacts, Moves, move, move_into
from core.projection.ops import Increments, merge_increments
from schemas.base import JobState

states = st.sampled_from(get_args(JobState))
facts_st = st.builds(
    JobFacts, batch_id=st.integers(1, 3), job_id=st.integers(1, 5),
    job_group_id=st.integers(0, 2), user=st.sampled_from(["alice", "bob"]),
    inst_coll=st.sampled_from(["standard", "highmem"]), cores_mcpu=st.sampled_from([250, 1000]),
    always_run=st.booleans(), cancelled=st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(facts_st, states, states,
                          st.sampled_from([[0], [1, 0], [2, 1, 0], []]), st.integers(0, 3)),
                max_size=12))
def test_move_into_adds_what_move_returns(moves: list[tuple]) -> None:  # type: ignore[type-arg]
    acc = Increments()
    ops = []
    for facts, old, new, ancestors, token in moves:
        ops += move(facts, old, new, ancestors, token)
        move_into(acc, facts, old, new, ancestors, token)
    assert acc.drain() == merge_increments(ops)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(facts_st, states, states,
                          st.sampled_from([[0], [1, 0], [2, 1, 0], []]), st.integers(0, 3)),
                max_size=40), st.integers(1, 40))
def test_moves_counted_first_add_what_every_move_returns(
        moves: list[tuple], drain_every: int) -> None:  # type: ignore[type-arg]
    """Counting movements before their increments (the projector's way) moves the same rows by
    the same amounts as each movement's ops, however often it is drained."""
    acc = Increments()
    counted = Moves()
    ops = []
    for i, (facts, old, new, ancestors, token) in enumerate(moves):
        ops += move(facts, old, new, ancestors, token)
        counted.add(facts, old, new, ancestors, token)
        if i % drain_every == 0:
            counted.drain_into(acc)
    counted.drain_into(acc)
    assert acc.drain() == merge_increments(ops)
    counted.drain_into(acc)
    assert acc.drain() == []


def test_a_job_that_runs_and_succeeds() -> None:
    """Ready to Running to Success: each group counts one job less ready and one more
    succeeded; the user's and the group's running resources come and go, leaving zeros."""
    facts = JobFacts(7, 1, 1, "alice", "standard", 250, False, False)
    acc = Increments()
    move_into(acc, facts, "Ready", "Running", [1, 0], 3)
    move_into(acc, facts, "Running", "Success", [1, 0], 3)
    got = {(i.table, tuple(sorted(i.key.items()))): dict(i.deltas) for i in acc.drain()}
    for group in (0, 1):
        assert got.pop((JOB_COUNTS, (("batch_id", 7), ("job_group_id", group)))) == {
            "n_ready": -1, "n_completed": 1, "n_succeeded": 1}
    assert got.pop((USER_RESOURCES, (("inst_coll", "standard"), ("token", 3),
                                     ("user", "alice")))) == {
        "n_ready_jobs": -1, "ready_cores_mcpu": -250}
    assert got.pop((CANCELLABLE, (("batch_id", 7), ("inst_coll", "standard"),
                                  ("job_group_id", 1), ("token", 3)))) == {
        "n_ready_cancellable_jobs": -1, "ready_cancellable_cores_mcpu": -250}
    assert got == {}
