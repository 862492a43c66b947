"""The audit's pure parts: selecting and rendering history, replay spans, lag, names."""

from __future__ import annotations

import json
import multiprocessing
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.base import JobResources
from schemas.batch import (
    BatchCancelled,
    BatchCompleted,
    BatchCreated,
    JobGroupCancelled,
    JobGroupRecord,
    JobGroupsSubmitted,
    JobRecord,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.envelope import wrap
from schemas.events import AnyEvent
from schemas.execution import (
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
)
from services.audit.history import (
    Entry,
    format_line,
    id_ranges,
    interleave,
    job_history,
    summary,
    to_json,
)
from services.audit.logread import partition_for
from services.audit.rebuild import default_database
from services.audit.replay import Claims, Span, behind, lanes_of, spans

T0 = 1_767_225_600_000


def _job(job_id: int, group: int = 0, parents: tuple[int, ...] = ()) -> JobRecord:
    return JobRecord(job_id=job_id, job_group_id=group, parent_ids=list(parents),
                     resources=JobResources(cores_mcpu=1000, memory_bytes=1 << 30),
                     inst_coll="standard", spec="{}")


def _entries(events: list[AnyEvent], topic: str = "batch-events", dt: int = 1) -> list[Entry]:
    return [Entry(topic, 2, i, wrap(e, event_id=f"e{i}", time_ms=T0 + i * dt))
            for i, e in enumerate(events)]


BATCH = _entries([
    BatchCreated(batch_id=7, user="alice", billing_project="p", token="t"),
    UpdateOpened(batch_id=7, update_id=1, token="u1", n_jobs=3, n_job_groups=2,
                 start_job_id=1, start_job_group_id=1),
    JobGroupsSubmitted(batch_id=7, update_id=1, job_groups=[
        JobGroupRecord(job_group_id=1, parent_id=0), JobGroupRecord(job_group_id=2, parent_id=1),
        JobGroupRecord(job_group_id=3, parent_id=0)]),
    JobsSubmitted(batch_id=7, update_id=1, jobs=[_job(1, 2), _job(2, 3), _job(3, 0, (1,))]),
    UpdateCommitted(batch_id=7, update_id=1, n_jobs=3, n_job_groups=3),
    JobScheduled(batch_id=7, job_id=1, attempt_id="a1", instance_name="w1", inst_coll="standard",
                 cores_mcpu=1000),
    JobScheduled(batch_id=7, job_id=2, attempt_id="a2", instance_name="w1", inst_coll="standard",
                 cores_mcpu=1000),
    JobGroupCancelled(batch_id=7, job_group_id=3),
    JobGroupCancelled(batch_id=7, job_group_id=1),
    JobCompleted(batch_id=7, job_id=1, attempt_id="a1", instance_name="w1", state="Success",
                 exit_code=0, end_time_ms=T0 + 100, status="{" + "x" * 200 + "}"),
    UpdateOpened(batch_id=7, update_id=2, token="u2", n_jobs=1, n_job_groups=0,
                 start_job_id=4, start_job_group_id=4),
    BatchCancelled(batch_id=7),
])


def _tags(entries: list[Entry] | None) -> list[str]:
    assert entries is not None
    return [e.envelope.tag for e in entries]


def test_a_job_history_follows_its_group_ancestry_and_update() -> None:
    got = job_history(BATCH, 1)
    assert _tags(got) == [
        "batch.created", "batch.update_opened", "batch.job_groups_submitted",
        "batch.jobs_submitted", "batch.update_committed", "job.scheduled",
        "job_group.cancelled", "job.completed", "batch.cancelled"]
    assert got is not None
    groups = got[2].envelope.event
    assert isinstance(groups, JobGroupsSubmitted)
    assert [g.job_group_id for g in groups.job_groups] == [1, 2]  # not the sibling group 3
    bunch = got[3].envelope.event
    assert isinstance(bunch, JobsSubmitted) and [j.job_id for j in bunch.jobs] == [1]
    cancelled = got[6].envelope.event
    assert isinstance(cancelled, JobGroupCancelled) and cancelled.job_group_id == 1
    assert [e.offset for e in got] == sorted(e.offset for e in got)


def test_a_job_in_the_root_group_sees_no_other_group() -> None:
    got = job_history(BATCH, 3)
    assert "job_group.cancelled" not in _tags(got)
    assert "batch.job_groups_submitted" not in _tags(got)


def test_an_unknown_job_has_no_history() -> None:
    assert job_history(BATCH, 99) is None


def test_interleave_keeps_each_log_in_order_and_places_by_time() -> None:
    primary = _entries([UpdateOpened(batch_id=7, update_id=i, token="u", n_jobs=0,
                                     n_job_groups=0, start_job_id=1, start_job_group_id=1)
                        for i in range(4)], dt=10)
    done = BatchCompleted(batch_id=7, outcome="success", n_jobs=0, n_succeeded=0, n_failed=0,
                          n_cancelled=0, time_completed_ms=T0)
    secondary = [Entry("completions", 0, 0, wrap(done, event_id="c", time_ms=T0 + 15))]
    merged = interleave(primary, secondary)
    assert [(e.topic, e.offset) for e in merged] == [
        ("batch-events", 0), ("batch-events", 1), ("completions", 0), ("batch-events", 2),
        ("batch-events", 3)]


@given(st.lists(st.integers(0, 50)), st.lists(st.integers(0, 50)))
def test_interleave_is_a_merge(a: list[int], b: list[int]) -> None:
    ev = UpdateCommitted(batch_id=1, update_id=1, n_jobs=0, n_job_groups=0)
    primary = [Entry("p", 0, i, wrap(ev, event_id="x", time_ms=t)) for i, t in enumerate(a)]
    secondary = [Entry("s", 0, i, wrap(ev, event_id="x", time_ms=t)) for i, t in enumerate(b)]
    merged = interleave(primary, secondary)
    assert [e for e in merged if e.topic == "p"] == primary
    assert [e for e in merged if e.topic == "s"] == secondary


@pytest.mark.parametrize(("ids", "text"), [
    ([], ""), ([3], "3"), ([1, 2, 3, 7], "1..3,7"), ([5, 1, 2, 9, 10], "1..2,5,9..10")],
    ids=["none", "one", "run-and-one", "unsorted"])
def test_id_ranges(ids: list[int], text: str) -> None:
    assert id_ranges(ids) == text


def test_summaries_show_key_fields_and_leave_out_defaults() -> None:
    assert summary(BATCH[0].envelope.event) == "user=alice billing_project=p token=t"
    assert summary(BATCH[3].envelope.event) == "jobs=1..3 (n=3) update_id=1"
    assert summary(BATCH[2].envelope.event) == "groups=1..3 update_id=1"
    mjc = summary(BATCH[9].envelope.event)
    assert mjc.startswith("job_id=1 attempt_id=a1 instance_name=w1 state=Success exit_code=0 ")
    assert "…" in mjc and len(mjc) < 200
    narrowed = job_history(BATCH, 3)
    assert narrowed is not None
    assert summary(narrowed[2].envelope.event) == (
        "jobs=3 (n=1) group=0 inst_coll=standard cores_mcpu=1000 parents=1 update_id=1")


def test_a_bunch_of_sjs_is_narrowed_to_the_job() -> None:
    singles = [JobScheduled(batch_id=7, job_id=j, attempt_id=f"a{j}", instance_name="w2",
                            inst_coll="standard", cores_mcpu=500) for j in (1, 2, 3)]
    entries = [*BATCH[:5], *_entries([JobsScheduled.of(7, singles)])]
    entries[-1] = entries[-1]._replace(offset=5)
    assert summary(entries[-1].envelope.event) == "jobs=1..3 (n=3)"
    got = job_history(entries, 2)
    assert got is not None and _tags(got)[-1] == "jobs.scheduled"
    narrowed = got[-1].envelope.event
    assert isinstance(narrowed, JobsScheduled) and narrowed.expand() == [singles[1]]
    assert summary(narrowed) == (
        "jobs=2 (n=1) attempt_id=a2 instance_name=w2 inst_coll=standard cores_mcpu=500")
    job_1 = job_history(entries, 1)
    assert job_1 is not None and "jobs.scheduled" in _tags(job_1)
    others = job_history([*BATCH[:5], *_entries([JobsScheduled.of(7, singles[::2])])], 2)
    assert others is not None and "jobs.scheduled" not in _tags(others)


def test_a_bunch_of_cancellations_is_narrowed_to_the_job() -> None:
    bunch = JobsCancelled(batch_id=7, job_ids=[1, 2, 3], reason="user")
    entries = [*BATCH[:5], *_entries([bunch])]
    assert summary(entries[-1].envelope.event) == "jobs=1..3 (n=3) reason=user"
    got = job_history(entries, 2)
    assert got is not None and _tags(got)[-1] == "jobs.cancelled"
    narrowed = got[-1].envelope.event
    assert isinstance(narrowed, JobsCancelled) and narrowed.job_ids == [2]
    others = job_history([*BATCH[:5], *_entries([JobsCancelled(batch_id=7, job_ids=[1, 3],
                                                                reason="user")])], 2)
    assert others is not None and "jobs.cancelled" not in _tags(others)


def test_a_bunch_of_mjcs_is_narrowed_to_the_job() -> None:
    singles = [JobCompleted(batch_id=7, job_id=j, attempt_id=f"a{j}", instance_name="w1",
                            state="Failed" if j == 3 else "Success", exit_code=int(j == 3),
                            end_time_ms=T0 + j) for j in (1, 3)]
    entries = [*BATCH[:5], *_entries([JobsCompleted.of(singles)])]
    assert summary(entries[-1].envelope.event) == "jobs=1,3 (n=2) instance_name=w1"
    got = job_history(entries, 3)
    assert got is not None and _tags(got)[-1] == "jobs.completed"
    narrowed = got[-1].envelope.event
    assert isinstance(narrowed, JobsCompleted) and narrowed.expand() == [singles[1]]
    assert summary(narrowed).startswith(
        "jobs=3 (n=1) attempt_id=a3 instance_name=w1 state=Failed exit_code=1")
    others = job_history(entries, 2)
    assert others is not None and "jobs.completed" not in _tags(others)


def test_format_line() -> None:
    line = format_line(BATCH[5])
    assert line.startswith("batch-events[2]@5")
    assert "2026-01-01T00:00:00.005Z  job.scheduled" in line
    assert line.endswith("job_id=1 attempt_id=a1 instance_name=w1 inst_coll=standard "
                         "cores_mcpu=1000")


def test_json_lines_carry_the_position_and_the_whole_envelope() -> None:
    got = json.loads(to_json(BATCH[9]))
    assert (got["topic"], got["partition"], got["offset"]) == ("batch-events", 2, 9)
    assert got["tag"] == "job.completed" and got["key"] == "7" and got["time_ms"] == T0 + 9
    assert got["event"]["status"] == "{" + "x" * 200 + "}"


def test_spans_go_topic_by_topic_from_start_to_end() -> None:
    end = {("batch-events", 1): 10, ("batch-events", 0): 5, ("control-events", 0): 3,
           ("control-events", 1): 0, ("batch-events", 2): 4}
    start = {("batch-events", 0): 5, ("batch-events", 2): 1}
    assert spans(start, end, ["control-events", "batch-events"]) == [
        Span("control-events", 0, 0, 3), Span("batch-events", 1, 0, 10),
        Span("batch-events", 2, 1, 4)]
    assert Span("batch-events", 2, 1, 4).label == "batch-events[2]"


_spans = st.lists(st.integers(0, 1000), max_size=12).map(
    lambda sizes: [Span("batch-events", p, 0, n) for p, n in enumerate(sizes)])


@given(_spans, st.integers(1, 6))
def test_lanes_hold_every_span_once_in_order_and_balance_load(todo: list[Span],
                                                              n: int) -> None:
    lanes = lanes_of(todo, n)
    assert sorted(s for lane in lanes for s in lane) == sorted(todo)
    assert len(lanes) <= n and all(lanes)
    for lane in lanes:
        assert lane == [s for s in todo if s in lane]
    if lanes:  # greedy: no lane exceeds the average by more than the biggest span
        loads = [sum(s.size for s in lane) for lane in lanes]
        biggest = max(s.size for s in todo)
        assert max(loads) <= sum(loads) / n + biggest


@given(_spans, st.lists(st.integers(0, 3), max_size=40))
def test_claims_give_every_span_to_exactly_one_lane_in_order(todo: list[Span],
                                                            turns: list[int]) -> None:
    """Lanes that ask in any interleaving take each span once, biggest first (equal ones in
    the given order)."""
    claims = Claims(todo, multiprocessing.Value("q", 0))
    lanes = [iter(claims) for _ in range(4)]
    taken: list[list[Span]] = [[] for _ in lanes]
    for lane in [*turns, *([0] * (len(todo) + 1))]:  # lane 0 ends up taking the rest
        span = next(lanes[lane], None)
        if span is not None:
            taken[lane].append(span)
    assert sorted(s for lane in taken for s in lane) == sorted(todo)
    order = sorted(todo, key=lambda s: -s.size)
    for lane in taken:
        assert lane == [s for s in order if s in lane]
    assert [s for it in lanes for s in it] == []  # nothing left for anyone


def test_claims_taken_from_threads_at_once_are_taken_once() -> None:
    todo = [Span("batch-events", p, 0, 1) for p in range(2_000)]
    claims = Claims(todo, multiprocessing.Value("q", 0))
    with ThreadPoolExecutor(4) as pool:
        taken = list(pool.map(lambda _: list(claims), range(4)))
    assert sorted(s for lane in taken for s in lane) == todo


def test_claims_hand_out_the_biggest_span_first() -> None:
    todo = [Span("control-events", 0, 0, 3), Span("batch-events", 0, 0, 90),
            Span("batch-events", 1, 0, 3), Span("batch-events", 2, 5, 60)]
    assert list(Claims(todo, multiprocessing.Value("q", 0))) == [todo[1], todo[3], todo[0],
                                                                 todo[2]]


def test_behind_lists_lagging_partitions_only() -> None:
    end = {("b", 0): 10, ("b", 1): 5, ("b", 2): 0}
    assert behind(end, {("b", 0): 10, ("b", 1): 2}) == {("b", 1): 3}
    assert behind(end, {("b", 0): 12, ("b", 1): 5}) == {}


@pytest.mark.parametrize(("live", "expected"), [
    ("hailstream", "hailstream_rebuild"), ("x" * 64, "x" * 56 + "_rebuild")],
    ids=["short", "long"])
def test_default_database(live: str, expected: str) -> None:
    assert default_database(live) == expected and len(default_database(live)) <= 64


def test_partition_for_matches_the_producers_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    for key in (b"1", b"7", b"12345", b"alice"):
        assert partition_for(key, 4) == DefaultPartitioner()(key, [0, 1, 2, 3], [0, 1, 2, 3])
