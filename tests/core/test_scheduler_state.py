from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.job_queue import JobQueue
from core.projection.commit import CommitJob, initial_states
from core.scheduler_state import (
    PENDING,
    READY,
    RUNNING,
    Batch,
    HeldBunch,
    SchedulerState,
    evolve,
    fold,
)
from schemas.base import CompletedJobState, JobResources, JobState
from schemas.batch import (
    BatchCancelled,
    BatchCreated,
    JobGroupCancelled,
    JobGroupRecord,
    JobGroupsSubmitted,
    JobRecord,
    JobsSubmitted,
    UpdateCommitted,
)
from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
    JobUnschedulable,
)
from schemas.infra import (
    InstanceActivated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceRequested,
    SchedulerElected,
)

# --- event builders (shared with test_scheduling) ---------------------------------------------


def created(b: int, user: str = "alice", n_failures: int | None = None) -> BatchCreated:
    return BatchCreated(batch_id=b, user=user, billing_project="p", token=f"t{b}",
                        cancel_after_n_failures=n_failures)


def groups(b: int, u: int, *pairs: tuple[int, int],
           limits: dict[int, int | None] | None = None) -> JobGroupsSubmitted:
    limits = limits or {}
    return JobGroupsSubmitted(batch_id=b, update_id=u, job_groups=[
        JobGroupRecord(job_group_id=g, parent_id=p, cancel_after_n_failures=limits.get(g))
        for g, p in pairs])


def jr(job_id: int, parents: Sequence[int] = (), *, cores: int = 1000, ic: str = "standard",
       regions: list[str] | None = None, always_run: bool = False, n_max: int = 20,
       group: int = 0) -> JobRecord:
    return JobRecord(job_id=job_id, job_group_id=group, parent_ids=list(parents),
                     always_run=always_run, n_max_attempts=n_max, inst_coll=ic, spec="{}",
                     resources=JobResources(cores_mcpu=cores, memory_bytes=1 << 30,
                                            regions=regions))


def submitted(b: int, u: int, *records: JobRecord) -> JobsSubmitted:
    return JobsSubmitted(batch_id=b, update_id=u, jobs=list(records))


def committed(b: int, u: int) -> UpdateCommitted:
    return UpdateCommitted(batch_id=b, update_id=u, n_jobs=0, n_job_groups=0)


def sj(b: int, j: int, attempt: str = "a1", inst: str = "i1", cores: int = 1000) -> JobScheduled:
    return JobScheduled(batch_id=b, job_id=j, attempt_id=attempt, instance_name=inst,
                        inst_coll="standard", cores_mcpu=cores)


def mjs(b: int, j: int, attempt: str = "a1", inst: str = "i1") -> JobStarted:
    return JobStarted(batch_id=b, job_id=j, attempt_id=attempt, instance_name=inst,
                      start_time_ms=1)


def mjc(b: int, j: int, state: CompletedJobState = "Success", attempt: str = "a1",
        inst: str = "i1") -> JobCompleted:
    return JobCompleted(batch_id=b, job_id=j, attempt_id=attempt, instance_name=inst,
                        state=state, end_time_ms=2)


def lost(b: int, j: int, attempt: str = "a1", inst: str = "i1") -> AttemptLost:
    return AttemptLost(batch_id=b, job_id=j, attempt_id=attempt, instance_name=inst,
                       reason="preempted", end_time_ms=2)


def instance(name: str, *, ic: str = "standard", region: str = "us-central1",
             cores: int = 4000) -> list[AnyEvent]:
    return [InstanceRequested(instance_name=name, inst_coll=ic, machine_type="n1", region=region,
                              cores_mcpu=cores, preemptible=True),
            InstanceActivated(instance_name=name, address="x", cores_mcpu=cores)]


def at_epoch(event: AnyEvent, epoch: int, n: int = 0) -> Envelope:
    return wrap(event, event_id=f"e{n}", time_ms=n, producer_epoch=epoch)


def where(state: SchedulerState) -> dict[tuple[int, int], str]:
    """Every live job's state, with a ``+cancel`` mark."""
    names = {PENDING: "Pending", READY: "Ready", RUNNING: "Running"}
    out = {}
    for b, batch in state.batches.items():
        for j, job in batch.jobs.items():
            out[(b, j)] = names[job.state] + ("+cancel" if job.cancel else "")
    return out


def check_invariants(state: SchedulerState) -> None:
    """Queues and counters hold exactly what the live jobs say."""
    ready: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    to_cancel: dict[str, list[tuple[int, int]]] = defaultdict(list)
    ready_mcpu: dict[tuple[str, str], int] = defaultdict(int)
    running_mcpu: dict[tuple[str, str], int] = defaultdict(int)
    used: dict[str, int] = defaultdict(int)
    attempts: dict[str, dict[tuple[int, int], str]] = defaultdict(dict)
    for b, batch in sorted(state.batches.items()):
        for j, job in sorted(batch.jobs.items()):
            key = (batch.user, job.inst_coll)
            assert (job.state == PENDING) == (job.n_pending > 0)
            assert (job.state == RUNNING) == (job.attempt_id is not None)
            assert not job.started or job.state == RUNNING
            if job.state == RUNNING and job.instance in state.instances:
                assert job.attempt_id is not None
                used[job.instance] += job.cores_mcpu
                attempts[job.instance][(b, j)] = job.attempt_id
            if job.state == PENDING:
                continue
            if job.cancel is not None:
                to_cancel[batch.user].append((b, j))
            elif job.state == RUNNING:
                running_mcpu[key] += job.cores_mcpu
            else:
                ready[key].append((b, j))
                ready_mcpu[key] += job.cores_mcpu
    assert {k: list(q) for k, q in state.ready.items() if len(q)} == dict(ready)
    assert {k: list(q) for k, q in state.to_cancel.items() if len(q)} == dict(to_cancel)
    assert state.ready_mcpu == {k: v for k, v in ready_mcpu.items() if v}
    assert state.running_mcpu == {k: v for k, v in running_mcpu.items() if v}
    for name, inst in state.instances.items():
        assert inst.used_mcpu == used[name], name
        assert inst.attempts == attempts[name], name
        assert state.running_on(name) == sorted((b, j, a) for (b, j), a in attempts[name].items())
    for b, g in state.failure_cancels:
        batch = state.batches[b]
        assert g not in batch.cancelled_groups
        assert batch.n_failures[g] >= batch.failure_limits[g]


# --- table-driven cases -----------------------------------------------------------------------

BASE: list[AnyEvent] = [created(1), *instance("i1")]

CASES: list[tuple[str, list[AnyEvent], dict[tuple[int, int], str]]] = [
    ("uncommitted jobs are held aside",
     [*BASE, submitted(1, 1, jr(1), jr(2, [1]))], {}),
    ("commit: no parents Ready, children Pending",
     [*BASE, submitted(1, 1, jr(1), jr(2, [1])), committed(1, 1)],
     {(1, 1): "Ready", (1, 2): "Pending"}),
    ("a duplicate commit and a late resubmission change nothing",
     [*BASE, submitted(1, 1, jr(1)), committed(1, 1), submitted(1, 1, jr(1)), committed(1, 1),
      sj(1, 1)],
     {(1, 1): "Running"}),
    ("SJ starts, MJS after it is a no-op, MJC ends and releases the child",
     [*BASE, submitted(1, 1, jr(1), jr(2, [1])), committed(1, 1), sj(1, 1), mjs(1, 1),
      mjc(1, 1)],
     {(1, 2): "Ready"}),
    ("MJS may overtake SJ",
     [*BASE, submitted(1, 1, jr(1)), committed(1, 1), mjs(1, 1), sj(1, 1)],
     {(1, 1): "Running"}),
    ("a failed parent cancels children that are not always_run",
     [*BASE, submitted(1, 1, jr(1), jr(2, [1]), jr(3, [1], always_run=True)), committed(1, 1),
      sj(1, 1), mjc(1, 1, "Failed")],
     {(1, 2): "Ready+cancel", (1, 3): "Ready"}),
    ("a later update sees its parents' outcomes",
     [*BASE, submitted(1, 1, jr(1), jr(2)), committed(1, 1), sj(1, 1), mjc(1, 1, "Error"),
      sj(1, 2, "a2"), mjc(1, 2, attempt="a2"),
      submitted(1, 2, jr(3, [1]), jr(4, [2]), jr(5, [2, 3])), committed(1, 2)],
     {(1, 3): "Ready+cancel", (1, 4): "Ready", (1, 5): "Pending"}),
    ("a lost attempt makes the job Ready again",
     [*BASE, submitted(1, 1, jr(1)), committed(1, 1), sj(1, 1), lost(1, 1)],
     {(1, 1): "Ready"}),
    ("a lost last attempt ends the job in Error",
     [*BASE, submitted(1, 1, jr(1, n_max=2), jr(2, [1])), committed(1, 1), sj(1, 1), lost(1, 1),
      sj(1, 1, "a2"), lost(1, 1, "a2")],
     {(1, 2): "Ready+cancel"}),
    ("a loss of another attempt changes nothing",
     [*BASE, submitted(1, 1, jr(1)), committed(1, 1), sj(1, 1, "a2"), lost(1, 1, "a1")],
     {(1, 1): "Running"}),
    ("cancelling a group cancels its descendants, not always_run jobs",
     [*BASE, groups(1, 1, (1, 0), (2, 1), (3, 0)),
      submitted(1, 1, jr(1, group=1), jr(2, group=2), jr(3, group=3),
                jr(4, group=2, always_run=True)),
      committed(1, 1), sj(1, 2), JobGroupCancelled(batch_id=1, job_group_id=1)],
     {(1, 1): "Ready+cancel", (1, 2): "Running+cancel", (1, 3): "Ready", (1, 4): "Ready"}),
    ("a cancelled batch cancels jobs committed later",
     [*BASE, submitted(1, 1, jr(1)), BatchCancelled(batch_id=1), committed(1, 1)],
     {(1, 1): "Ready+cancel"}),
    ("job.cancelled ends a job; its children see a failed parent",
     [*BASE, submitted(1, 1, jr(1), jr(2, [1])), committed(1, 1),
      JobCancelled(batch_id=1, job_id=1, reason="user")],
     {(1, 2): "Ready+cancel"}),
    ("a permanently unschedulable job ends (in Error); its children see a failed parent",
     [*BASE, submitted(1, 1, jr(1), jr(2), jr(3, [1])), committed(1, 1),
      JobUnschedulable(batch_id=1, job_id=1, reason="too big", permanent=True),
      JobUnschedulable(batch_id=1, job_id=2, reason="not now")],
     {(1, 2): "Ready", (1, 3): "Ready+cancel"}),
    ("events of unknown batches are ignored",
     [sj(9, 1), mjc(9, 1), committed(9, 1), BatchCancelled(batch_id=9)], {}),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_cases(events: list[AnyEvent], expected: dict[tuple[int, int], str]) -> None:
    state = fold(events)
    assert where(state) == expected
    check_invariants(state)


def test_instance_cores_follow_attempts() -> None:
    state = fold([*BASE, submitted(1, 1, jr(1, cores=1500), jr(2, cores=500)), committed(1, 1),
                  sj(1, 1), sj(1, 2, "b1")])
    assert state.instances["i1"].free_mcpu == 2000
    ends: list[AnyEvent] = [mjc(1, 1), lost(1, 2, "b1")]
    for event in ends:
        state.apply(event)
    assert state.instances["i1"].free_mcpu == 4000
    state.apply(InstanceDeactivated(instance_name="i1", reason="idle"))
    assert not state.instances["i1"].active
    state.apply(InstanceDeleted(instance_name="i1", reason="idle"))
    assert "i1" not in state.instances


STARTED_BASE: list[AnyEvent] = [*BASE, submitted(1, 1, jr(1)), committed(1, 1)]

STARTED_CASES: list[tuple[str, list[AnyEvent], str, bool]] = [
    ("SJ alone: scheduled, not started", [sj(1, 1)], "Running", False),
    ("MJS of the current attempt after SJ", [sj(1, 1), mjs(1, 1)], "Running", True),
    ("MJS that moves a Ready job to Running", [mjs(1, 1)], "Running", True),
    ("SJ after the MJS of the same attempt changes nothing", [mjs(1, 1), sj(1, 1)], "Running",
     True),
    ("MJS of another attempt", [sj(1, 1, "a2"), mjs(1, 1, "a1")], "Running", False),
    ("a lost attempt resets it", [sj(1, 1), mjs(1, 1), lost(1, 1)], "Ready", False),
    ("the next attempt starts unstarted", [sj(1, 1), mjs(1, 1), lost(1, 1), sj(1, 1, "a2")],
     "Running", False),
    ("the next attempt's MJS", [sj(1, 1), mjs(1, 1), lost(1, 1), sj(1, 1, "a2"),
                                mjs(1, 1, "a2")], "Running", True),
    ("a late MJS of the lost attempt does not start the new one",
     [sj(1, 1), lost(1, 1), sj(1, 1, "a2"), mjs(1, 1, "a1")], "Running", False),
]


@pytest.mark.parametrize(("events", "expected_state", "started"),
                         [c[1:] for c in STARTED_CASES], ids=[c[0] for c in STARTED_CASES])
def test_started_follows_the_current_attempt(events: list[AnyEvent], expected_state: str,
                                             started: bool) -> None:
    state = fold([*STARTED_BASE, *events])
    job = state.job(1, 1)
    assert job is not None
    assert where(state)[(1, 1)] == expected_state
    assert job.started is started
    check_invariants(state)


def test_running_on_lists_the_attempts_of_an_instance() -> None:
    state = fold([*BASE, *instance("i2"), submitted(1, 1, jr(1), jr(2), jr(3)), committed(1, 1),
                  sj(1, 2, "b2"), mjs(1, 1, "b1"), sj(1, 3, "b3", inst="i2")])
    assert state.running_on("i1") == [(1, 1, "b1"), (1, 2, "b2")]
    assert state.running_on("i2") == [(1, 3, "b3")]
    assert state.running_on("nowhere") == []
    state.apply(mjc(1, 1, attempt="b1"))
    state.apply(lost(1, 3, "b3", "i2"))
    assert state.running_on("i1") == [(1, 2, "b2")]
    assert state.running_on("i2") == []
    check_invariants(state)


def test_deleting_an_instance_leaves_its_attempts_running_until_lost() -> None:
    state = fold([*BASE, submitted(1, 1, jr(1)), committed(1, 1), sj(1, 1),
                  InstanceDeleted(instance_name="i1", reason="lost")])
    assert where(state) == {(1, 1): "Running"} and state.running_on("i1") == []
    state.apply(lost(1, 1))
    assert where(state) == {(1, 1): "Ready"}
    check_invariants(state)


def test_a_recreated_instance_name_is_not_charged_for_old_attempts() -> None:
    state = fold([*BASE, submitted(1, 1, jr(1)), committed(1, 1), sj(1, 1),
                  InstanceDeleted(instance_name="i1", reason="lost"), *instance("i1")])
    state.apply(lost(1, 1))
    assert state.instances["i1"].used_mcpu == 0


def test_deactivated_instances_are_told_apart_from_new_ones() -> None:
    state = fold([InstanceRequested(instance_name="i1", inst_coll="standard", machine_type="n1",
                                    region="us", cores_mcpu=4000, preemptible=True)])
    inst = state.instances["i1"]
    assert (inst.active, inst.deactivated) == (False, False)  # being created
    state.apply(InstanceActivated(instance_name="i1", address="x", cores_mcpu=4000))
    assert (inst.active, inst.deactivated) == (True, False)
    state.apply(InstanceDeactivated(instance_name="i1", reason="idle"))
    assert (inst.active, inst.deactivated) == (False, True)


# --- cancel_after_n_failures ----------------------------------------------------------------------

# Groups: 1 under the batch, 2 under 1, 3 under the batch.
TREE = [(1, 0), (2, 1), (3, 0)]


def failing(*records: JobRecord, batch_limit: int | None = None,
            limits: dict[int, int | None] | None = None) -> list[AnyEvent]:
    return [created(1, n_failures=batch_limit), *instance("i1", cores=64_000),
            groups(1, 1, *TREE, limits=limits), submitted(1, 1, *records), committed(1, 1)]


def ended(j: int, state: CompletedJobState) -> list[AnyEvent]:
    return [sj(1, j, f"a{j}"), mjc(1, j, state, f"a{j}")]


FAILURE_CASES: list[tuple[str, list[AnyEvent], set[tuple[int, int]], dict[int, int]]] = [
    ("below the batch's limit",
     [*failing(jr(1), jr(2), batch_limit=2), *ended(1, "Failed")], set(), {0: 1}),
    ("Failed and Error reach the batch's limit",
     [*failing(jr(1), jr(2), batch_limit=2), *ended(1, "Failed"), *ended(2, "Error")],
     {(1, 0)}, {0: 2}),
    ("Success, Cancelled and job.cancelled do not count",
     [*failing(jr(1), jr(2), jr(3), batch_limit=1), *ended(1, "Success"),
      *ended(2, "Cancelled"), JobCancelled(batch_id=1, job_id=3, reason="user")], set(), {}),
    ("a lost last attempt ends in Error and counts",
     [*failing(jr(1, n_max=1), batch_limit=1), sj(1, 1), lost(1, 1)], {(1, 0)}, {0: 1}),
    ("a lost attempt that is retried does not count",
     [*failing(jr(1, n_max=2), batch_limit=1), sj(1, 1), lost(1, 1)], set(), {}),
    ("a failure counts in its group and every ancestor",
     [*failing(jr(1, group=2), batch_limit=1, limits={1: 1, 2: 1, 3: 1}), *ended(1, "Failed")],
     {(1, 0), (1, 1), (1, 2)}, {0: 1, 1: 1, 2: 1}),
    ("sibling groups count apart",
     [*failing(jr(1, group=3), jr(2, group=1), limits={1: 2, 3: 2}), *ended(1, "Failed"),
      *ended(2, "Failed")], set(), {1: 1, 3: 1}),
    ("cancelling the group folds the entry away",
     [*failing(jr(1, group=1), limits={1: 1}), *ended(1, "Failed"),
      JobGroupCancelled(batch_id=1, job_group_id=1, reason="n_failures")], set(), {1: 1}),
    ("cancelling the batch folds every entry of the batch away",
     [*failing(jr(1, group=2), batch_limit=1, limits={2: 1}), *ended(1, "Failed"),
      BatchCancelled(batch_id=1, reason="n_failures")], set(), {0: 1, 2: 1}),
    ("cancelling an ancestor folds a descendant's entry away",
     [*failing(jr(1, group=2), limits={2: 1}), *ended(1, "Failed"),
      JobGroupCancelled(batch_id=1, job_group_id=1)], set(), {2: 1}),
    ("a group that is already cancelled is not cancelled again",
     [*failing(jr(1, group=1, always_run=True), limits={1: 1}),
      JobGroupCancelled(batch_id=1, job_group_id=1), *ended(1, "Failed")], set(), {1: 1}),
    ("failures past the limit keep one entry",
     [*failing(jr(1), jr(2), jr(3), batch_limit=1), *ended(1, "Failed"), *ended(2, "Failed")],
     {(1, 0)}, {0: 2}),
]


@pytest.mark.parametrize(("events", "expected", "counts"), [c[1:] for c in FAILURE_CASES],
                         ids=[c[0] for c in FAILURE_CASES])
def test_cancel_after_n_failures(events: list[AnyEvent], expected: set[tuple[int, int]],
                                 counts: dict[int, int]) -> None:
    state = fold(events)
    assert state.failure_cancels == expected
    assert state.batches[1].n_failures == counts
    check_invariants(state)


def test_failure_counts_take_part_in_equality() -> None:
    events = failing(jr(1), batch_limit=1)
    assert fold([*events, *ended(1, "Failed")]) != fold([*events, *ended(1, "Success")])


def test_a_stale_epoch_sj_is_ignored() -> None:
    state = fold([*BASE, submitted(1, 1, jr(1), jr(2), jr(3)), committed(1, 1),
                  at_epoch(SchedulerElected(epoch=2, scheduler_id="s2"), 0)])
    state.apply(at_epoch(sj(1, 1), 1))
    state.apply(at_epoch(sj(1, 2), 2))
    state.apply(at_epoch(sj(1, 3), 3))
    assert where(state) == {(1, 1): "Ready", (1, 2): "Running", (1, 3): "Running"}
    state.apply(SchedulerElected(epoch=1, scheduler_id="old"))  # epochs never go back
    assert state.epoch == 2
    check_invariants(state)


def test_a_bunch_of_sjs_folds_as_its_single_sjs() -> None:
    base = [*BASE, *instance("i2"), submitted(1, 1, jr(1), jr(2), jr(3, [1]), jr(4)),
            committed(1, 1)]
    singles = [sj(1, 1), sj(1, 2, inst="i2"), sj(1, 4, "a9")]
    bunched = fold([*base, JobsScheduled.of(1, singles), mjc(1, 1)])
    assert bunched == fold([*base, *singles, mjc(1, 1)])
    assert where(bunched) == {(1, 2): "Running", (1, 3): "Ready", (1, 4): "Running"}
    check_invariants(bunched)


def test_a_bunch_of_mjcs_folds_as_its_single_mjcs() -> None:
    base = [*BASE, submitted(1, 1, jr(1), jr(2), jr(3, [1, 2]), jr(4)), committed(1, 1),
            sj(1, 1), sj(1, 2), sj(1, 4)]
    singles = [mjc(1, 1), mjc(1, 2, "Failed"), mjc(1, 9)]  # job 9 is unknown: ignored
    bunched = fold([*base, JobsCompleted.of(singles)])
    assert bunched == fold([*base, *singles])
    assert where(bunched) == {(1, 3): "Ready+cancel", (1, 4): "Running"}
    check_invariants(bunched)


def test_a_bunch_of_cancellations_folds_as_its_single_ones() -> None:
    base = [*BASE, submitted(1, 1, jr(1), jr(2), jr(3, [1]), jr(4)), committed(1, 1),
            BatchCancelled(batch_id=1)]
    bunch = JobsCancelled(batch_id=1, job_ids=[1, 2, 9], reason="user")  # 9 is unknown
    bunched = fold([*base, bunch])
    assert bunched == fold([*base, *bunch.expand()])
    assert where(bunched) == {(1, 3): "Ready+cancel", (1, 4): "Ready+cancel"}
    check_invariants(bunched)


def test_a_stale_epoch_bunch_is_ignored() -> None:
    state = fold([*BASE, submitted(1, 1, jr(1), jr(2), jr(3)), committed(1, 1),
                  at_epoch(SchedulerElected(epoch=2, scheduler_id="s2"), 0)])
    state.apply(at_epoch(JobsScheduled.of(1, [sj(1, 1), sj(1, 2)]), 1))
    assert where(state) == {(1, 1): "Ready", (1, 2): "Ready", (1, 3): "Ready"}
    state.apply(at_epoch(JobsScheduled.of(1, [sj(1, 2), sj(1, 3)]), 2))
    assert where(state) == {(1, 1): "Ready", (1, 2): "Running", (1, 3): "Running"}
    check_invariants(state)


_REGIONS = st.one_of(st.none(), st.lists(st.sampled_from(["us-east1", "us-west1", "eu"]),
                                         min_size=1, max_size=3, unique=True))


@given(st.data())
def test_held_bunches_make_the_jobs_their_heads_describe(data: st.DataObject) -> None:
    """Held as columns, resent or not, a bunch's jobs come out at the commit with every field
    of their heads, and only its last copy counts."""
    n = data.draw(st.integers(1, 12))
    records = [jr(j, data.draw(st.lists(st.integers(1, j - 1), max_size=2, unique=True))
                  if j > 1 else (),
                  cores=data.draw(st.sampled_from([250, 1000, 4000])),
                  ic=data.draw(st.sampled_from(["standard", "highmem"])),
                  regions=data.draw(_REGIONS), always_run=data.draw(st.booleans()),
                  n_max=data.draw(st.integers(1, 30)), group=0)
               for j in range(1, n + 1)]
    if data.draw(st.booleans(), label="runs"):  # as ingest sends them: runs of ids
        cut = data.draw(st.integers(0, n))
        bunches = [b for b in (records[:cut], records[cut:]) if b]
        # A retry of the whole bunch, or of its tail: a run that overlaps another.
        resent = [b[data.draw(st.integers(0, len(b) - 1)):]
                  for b in data.draw(st.lists(st.sampled_from(bunches), max_size=2))]
    else:  # any order, and a retry of part of a bunch: the same jobs by id
        shuffled = data.draw(st.permutations(records))
        cut = data.draw(st.integers(0, n))
        bunches = [b for b in (shuffled[:cut], shuffled[cut:]) if b]
        resent = [b[:data.draw(st.integers(1, len(b)))]
                  for b in data.draw(st.lists(st.sampled_from(bunches), max_size=2))]
    state = fold([*BASE, *(submitted(1, 1, *b) for b in [*bunches, *resent])])
    held = state.batches[1].held[1]
    assert all(isinstance(b, HeldBunch) for b in held)
    assert len(held) == len(bunches) + len(resent)
    state.apply(committed(1, 1))
    jobs = state.batches[1].jobs
    assert sorted(jobs) == list(range(1, n + 1))
    for r in records:
        job = jobs[r.job_id]
        want_regions = None if r.resources.regions is None else tuple(sorted(
            r.resources.regions))
        assert (job.group, job.cores_mcpu, job.inst_coll, job.regions, job.always_run,
                job.n_max_attempts) == (r.job_group_id, r.resources.cores_mcpu, r.inst_coll,
                                        want_regions, r.always_run, r.n_max_attempts)
        assert job.n_pending == len(r.parent_ids)  # no parent has ended
        assert job.state == (READY if not r.parent_ids else PENDING)
    children = {p: sorted(r.job_id for r in records if p in r.parent_ids)
                for r in records for p in r.parent_ids}
    assert state.batches[1].children == children
    assert not state.batches[1].held


class _OneByOne(SchedulerState):
    """The scheduler's state with every job committed by the per-job rule."""

    def _commit_ready_run(self, batch_id: int, batch: Batch, bunch: HeldBunch) -> bool:
        return False


@given(st.data())
def test_a_bunch_of_independent_jobs_commits_as_its_jobs_one_by_one(
        data: st.DataObject) -> None:
    """A bunch committed whole (no parents, one pool, no cancelled group) leaves the state the
    per-job rule leaves: the same jobs, queues and counters, beside jobs already there (an
    earlier update's, some of them ended) and bunches that take the per-job rule."""
    n_old = data.draw(st.integers(0, 5))
    events: list[AnyEvent] = [*BASE, groups(1, 1, (1, 0))]
    if n_old:
        events += [submitted(1, 1, *(jr(j, ic=data.draw(st.sampled_from(["standard", "highmem"])))
                                     for j in range(1, n_old + 1))), committed(1, 1)]
        events += [mjc(1, j, data.draw(st.sampled_from(["Success", "Failed"])))
                   for j in data.draw(st.sets(st.integers(1, n_old)))]
    if data.draw(st.booleans(), label="a cancelled group"):
        events.append(JobGroupCancelled(batch_id=1, job_group_id=data.draw(
            st.sampled_from([0, 1]))))
    first = n_old + 1
    bunches = []
    for _ in range(data.draw(st.integers(1, 4))):
        n = data.draw(st.integers(1, 6))
        ids = range(first, first + n)
        one_pool = data.draw(st.booleans(), label="one pool")
        bunches.append(submitted(1, 2, *(
            jr(j, data.draw(st.lists(st.integers(1, j - 1), max_size=2, unique=True))
               if j > 1 and data.draw(st.booleans(), label="parents") else (),
               cores=data.draw(st.sampled_from([250, 1000])),
               ic="standard" if one_pool else data.draw(st.sampled_from(["standard", "highmem"])),
               regions=data.draw(_REGIONS), always_run=data.draw(st.booleans()),
               n_max=data.draw(st.integers(1, 30)), group=data.draw(st.sampled_from([0, 1])))
            for j in ids)))
        first += n
    events += [*bunches, committed(1, 2)]
    whole, one_by_one = SchedulerState(), _OneByOne()
    for event in events:
        whole.apply(event)
        one_by_one.apply(event)
    assert whole == one_by_one
    assert where(whole) == where(one_by_one)
    check_invariants(whole)


def test_a_bunch_of_independent_jobs_is_committed_whole() -> None:
    """The usual bunch takes the whole-bunch path, and a bunch with a parent does not."""
    taken: list[int] = []

    class Counting(SchedulerState):
        def _commit_ready_run(self, batch_id: int, batch: Batch, bunch: HeldBunch) -> bool:
            done = super()._commit_ready_run(batch_id, batch, bunch)
            if done:
                taken.append(bunch.job_ids[0])
            return done

    state = Counting()
    for event in [*BASE, submitted(1, 1, jr(1), jr(2)), submitted(1, 1, jr(3, [1]), jr(4)),
                  submitted(1, 1, jr(5, ic="highmem"), jr(6)), submitted(1, 1, jr(7)),
                  committed(1, 1)]:
        state.apply(event)
    assert taken == [1, 7]
    assert where(state) == {(1, 1): "Ready", (1, 2): "Ready", (1, 3): "Pending",
                            (1, 4): "Ready", (1, 5): "Ready", (1, 6): "Ready", (1, 7): "Ready"}
    check_invariants(state)


def test_commit_of_a_missing_parent_is_refused() -> None:
    with pytest.raises(ValueError, match="not committed"):
        fold([*BASE, submitted(1, 1, jr(1, [7])), committed(1, 1)])


def test_job_queue_orders_by_batch_then_job() -> None:
    q = JobQueue()
    for b, j in [(2, 5), (1, 900), (2, 1), (1, 3), (1, 3)]:
        q.add(b, j)
    assert list(q) == [(1, 3), (1, 900), (2, 1), (2, 5)] and len(q) == 4
    q.discard(1, 900)
    q.discard(1, 3)
    q.discard(7, 1)
    assert list(q) == [(2, 1), (2, 5)] and (2, 5) in q and (1, 3) not in q


@given(st.lists(st.tuples(st.integers(1, 2), st.integers(0, 40), st.integers(0, 12),
                         st.booleans()), max_size=12))
def test_adding_a_run_adds_each_of_its_jobs(steps: list[tuple[int, int, int, bool]]) -> None:
    """``add_run`` leaves the queue that adding its jobs one by one leaves, over jobs already
    queued, runs that overlap and empty runs; discards in between."""
    runs, ones = JobQueue(), JobQueue()
    for batch_id, first, n, discard in steps:
        if discard:
            for j in range(first, first + n):
                runs.discard(batch_id, j)
                ones.discard(batch_id, j)
            continue
        runs.add_run(batch_id, first, n)
        for j in range(first, first + n):
            ones.add(batch_id, j)
        assert len(runs) == len(ones) and list(runs) == list(ones)


def test_evolve_returns_the_state() -> None:
    state = SchedulerState()
    assert evolve(state, created(1)) is state and state.batches[1].user == "alice"


# --- the commit rule equals core.projection.commit ----------------------------------------------

@given(st.data())
def test_commit_matches_initial_states(data: st.DataObject) -> None:
    n_old = data.draw(st.integers(0, 6))
    outcomes: list[JobState] = data.draw(st.lists(
        st.sampled_from(["Pending", "Ready", "Running", "Success", "Failed", "Cancelled"]),
        min_size=n_old, max_size=n_old))
    n_new = data.draw(st.integers(1, 6))
    ids = list(range(1, n_old + n_new + 1))
    new = [jr(j, data.draw(st.lists(st.sampled_from(ids[: j - 1]), unique=True)) if j > 1
              else [], always_run=data.draw(st.booleans()), group=data.draw(st.sampled_from(
                  [0, 1])))
           for j in ids[n_old:]]
    cancelled = data.draw(st.booleans())
    # The old jobs reach their outcomes one by one; the new update then commits.
    events: list[AnyEvent] = [created(1), groups(1, 1, (1, 0)),
                              submitted(1, 1, *(jr(j) for j in ids[:n_old])), committed(1, 1)]
    for j, outcome in zip(ids, outcomes, strict=False):
        if outcome == "Running":
            events.append(sj(1, j))
        elif outcome in ("Success", "Failed"):
            events.append(mjc(1, j, outcome))
        elif outcome == "Cancelled":
            events.append(JobCancelled(batch_id=1, job_id=j, reason="user"))
    if cancelled:
        events.append(JobGroupCancelled(batch_id=1, job_group_id=1))
    events += [submitted(1, 2, *new), committed(1, 2)]
    state = fold(events)
    expected = initial_states(
        [CommitJob(r.job_id, r.job_group_id, r.inst_coll, 1000, r.always_run) for r in new],
        [(r.job_id, p) for r in new for p in r.parent_ids],
        {j: ("Ready" if o == "Pending" else o) for j, o in zip(ids, outcomes, strict=False)},
        frozenset({1}) if cancelled else frozenset())
    for start in expected:
        job = state.job(1, start.job_id)
        assert job is not None
        assert ("Pending" if job.state == PENDING else "Ready") == start.state
        assert job.n_pending == start.n_pending_parents
        assert (job.cancel is not None) == start.cancelled
    check_invariants(state)


# --- random legal event sequences ---------------------------------------------------------------

class Sim:
    """Drives a state with random legal events and keeps a simple model to check it against."""

    def __init__(self, data: st.DataObject, n_batches: int = 2) -> None:
        self.data = data
        self.log: list[Envelope | AnyEvent] = []
        self.state = SchedulerState()
        self.n = itertools.count()
        self.ended: dict[tuple[int, int], str] = {}
        self.parents: dict[tuple[int, int], list[int]] = {}
        self.always_run: dict[tuple[int, int], bool] = {}
        self.group_of: dict[tuple[int, int], int] = {}
        self.group_parent: dict[tuple[int, int], int] = {}
        self.cancelled_groups: set[tuple[int, int]] = set()
        self.limits: dict[tuple[int, int], int] = {}
        self.n_failed: dict[tuple[int, int], int] = {}
        self.failure_cancels: set[tuple[int, int]] = set()
        self.mjs_seen: set[tuple[int, int, str]] = set()
        """MJS folded for an attempt that was current then, and not lost since."""
        self.updates: list[tuple[int, int]] = []
        for name, region in [("i1", "us"), ("i2", "eu"), ("i3", "us")]:
            for e in instance(name, region=region, cores=data.draw(st.sampled_from(
                    [1000, 2000, 4000]))):
                self.emit(e)
        for b in range(1, n_batches + 1):
            limit = st.sampled_from([None, 1, 2, 3])
            limits = {g: data.draw(limit) for g in (0, 1, 2)}
            self.limits |= {(b, g): n for g, n in limits.items() if n is not None}
            self.emit(created(b, data.draw(st.sampled_from(["alice", "bob"])), limits[0]))
            self.emit(groups(b, 1, (1, 0), (2, 1), limits=limits))
            self.group_parent |= {(b, 1): 0, (b, 2): 1}
            next_id = 1
            for u in (1, 2):
                records = []
                for j in range(next_id, next_id + data.draw(st.integers(1, 5))):
                    parents = data.draw(st.lists(st.integers(1, j - 1), unique=True, max_size=2)
                                        ) if j > 1 else []
                    r = jr(j, parents, cores=data.draw(st.sampled_from([500, 1000, 3000])),
                           always_run=data.draw(st.booleans()),
                           regions=data.draw(st.sampled_from([None, ["us"], ["eu"]])),
                           n_max=data.draw(st.integers(1, 3)), group=data.draw(st.integers(0, 2)))
                    records.append(r)
                    self.parents[(b, j)] = parents
                    self.always_run[(b, j)] = r.always_run
                    self.group_of[(b, j)] = r.job_group_id
                next_id += len(records)
                self.emit(submitted(b, u, *records))
                self.updates.append((b, u))

    def emit(self, event: AnyEvent | Envelope) -> None:
        self.log.append(event)
        self.state.apply(event)
        inner = event.event if isinstance(event, Envelope) else event
        singles = inner.expand() if isinstance(inner, JobsCancelled) else [inner]
        for one in singles:
            if isinstance(one, JobCompleted | JobCancelled | AttemptLost | JobUnschedulable):
                key = (one.batch_id, one.job_id)
                if (key not in self.ended and self.state.job(*key) is None
                        and key in self.parents):
                    state = (one.state if isinstance(one, JobCompleted) else
                             "Cancelled" if isinstance(one, JobCancelled) else "Error")
                    self.ended[key] = state
                    if self.ended[key] in ("Failed", "Error"):
                        self.count_failure(key)
        if isinstance(inner, AttemptLost):
            self.mjs_seen.discard((inner.batch_id, inner.job_id, inner.attempt_id))
        if isinstance(inner, JobStarted):
            job = self.state.job(inner.batch_id, inner.job_id)
            if job is not None and job.attempt_id == inner.attempt_id:
                self.mjs_seen.add((inner.batch_id, inner.job_id, inner.attempt_id))
        if isinstance(inner, BatchCancelled | JobGroupCancelled):
            g = inner.job_group_id if isinstance(inner, JobGroupCancelled) else 0
            self.cancelled_groups.add((inner.batch_id, g))
            self.failure_cancels = {k for k in self.failure_cancels if not self.under_cancel(*k)}

    def ancestry(self, b: int, g: int) -> list[int]:
        """``g`` and its ancestors up to the batch (group 0)."""
        out = [g]
        while g != 0:
            g = self.group_parent[(b, g)]
            out.append(g)
        return out

    def under_cancel(self, b: int, g: int) -> bool:
        return any((b, a) in self.cancelled_groups for a in self.ancestry(b, g))

    def count_failure(self, key: tuple[int, int]) -> None:
        b = key[0]
        for g in self.ancestry(b, self.group_of[key]):
            if (b, g) in self.limits:
                n = self.n_failed[(b, g)] = self.n_failed.get((b, g), 0) + 1
                if n >= self.limits[(b, g)] and not self.under_cancel(b, g):
                    self.failure_cancels.add((b, g))

    def live(self, code: int) -> list[tuple[int, int]]:
        return sorted(k for k in where_codes(self.state) if where_codes(self.state)[k] == code)

    def step(self) -> None:
        kinds = ["sj", "mjs", "started", "mjc", "lost", "cancel_group", "cancel_job", "elect",
                 "dup"]
        if self.updates:
            kinds.append("commit")
        kind = self.data.draw(st.sampled_from(kinds))
        ready, running = self.live(READY), self.live(RUNNING)
        n = next(self.n)
        if kind == "commit":
            b, u = self.updates.pop(0)
            self.emit(committed(b, u))
        elif kind in ("sj", "mjs") and ready:
            b, j = self.data.draw(st.sampled_from(ready))
            job = self.state.job(b, j)
            assert job is not None
            fits = [name for name, i in sorted(self.state.instances.items())
                    if i.free_mcpu >= job.cores_mcpu]
            if not fits:  # a legal history never over-allocates an instance
                return
            inst = self.data.draw(st.sampled_from(fits))
            event = (sj if kind == "sj" else mjs)(b, j, f"a{n}", inst)
            self.emit(at_epoch(event, self.state.epoch, n) if kind == "sj" else event)
        elif kind == "started" and running:
            b, j = self.data.draw(st.sampled_from(running))
            job = self.state.job(b, j)
            assert job is not None and job.attempt_id and job.instance
            self.emit(mjs(b, j, job.attempt_id, job.instance))
        elif kind in ("mjc", "lost") and running:
            b, j = self.data.draw(st.sampled_from(running))
            job = self.state.job(b, j)
            assert job is not None and job.attempt_id and job.instance
            if kind == "lost":
                self.emit(lost(b, j, job.attempt_id, job.instance))
            else:
                self.emit(mjc(b, j, self.data.draw(st.sampled_from(["Success", "Failed"])),
                              job.attempt_id, job.instance))
        elif kind == "cancel_group":
            b, g = self.data.draw(st.sampled_from([(1, 0), (1, 1), (1, 2), (2, 1)]))
            self.emit(JobGroupCancelled(batch_id=b, job_group_id=g) if g else
                      BatchCancelled(batch_id=b))
        elif kind == "cancel_job" and ready:
            b, j = self.data.draw(st.sampled_from(ready))
            self.emit(JobCancelled(batch_id=b, job_id=j, reason="user"))
        elif kind == "elect":
            self.emit(SchedulerElected(epoch=self.state.epoch + 1, scheduler_id=f"s{n}"))
        elif kind == "dup" and self.log:
            self.emit(self.data.draw(st.sampled_from(self.log)))  # redelivery is harmless

    def check(self) -> None:
        check_invariants(self.state)
        assert self.state.failure_cancels == self.failure_cancels
        for b, batch in self.state.batches.items():
            assert batch.n_failures == {g: n for (bb, g), n in self.n_failed.items() if bb == b}
        for (b, j), job in ((k, self.state.job(*k)) for k in self.parents):
            if job is None:
                continue
            parents = self.parents[(b, j)]
            assert job.n_pending == sum((b, p) not in self.ended for p in parents)
            failed = any(self.ended.get((b, p), "Success") != "Success" for p in parents)
            g: int | None = self.group_of[(b, j)]
            under_cancel = False
            while g is not None:
                under_cancel = under_cancel or (b, g) in self.cancelled_groups
                g = self.group_parent.get((b, g))
            expected = not self.always_run[(b, j)] and (failed or under_cancel)
            assert (job.cancel is not None) == expected, (b, j)
            assert job.started == (job.state == RUNNING and (
                b, j, job.attempt_id) in self.mjs_seen), (b, j)


def where_codes(state: SchedulerState) -> dict[tuple[int, int], int]:
    return {(b, j): job.state for b, batch in state.batches.items()
            for j, job in batch.jobs.items()}


def replay(log: Iterable[Envelope | AnyEvent]) -> SchedulerState:
    return fold(log)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_legal_sequences_keep_queues_exact(data: st.DataObject) -> None:
    sim = Sim(data)
    for _ in range(data.draw(st.integers(0, 40))):
        sim.step()
        sim.check()
    assert replay(sim.log) == sim.state
    assert replay(sim.log) == replay(sim.log)


def test_committed_jobs_are_not_tracked_by_the_cyclic_collector() -> None:
    """A commit makes a job object per job (a million at once for a big batch): they hold no
    references that could form a cycle, and tracked, they set off collections that cost a
    third of the commit (so ``Job`` is a struct the collector does not track)."""
    import gc

    state = fold([created(1), submitted(1, 1, jr(1), jr(2, [1], regions=["us-east1"])),
                  committed(1, 1), sj(1, 1)])
    jobs = state.batches[1].jobs
    assert set(jobs) == {1, 2} and jobs[1].state == RUNNING and jobs[2].state == PENDING
    assert jobs[2].regions == ("us-east1",)
    assert not any(gc.is_tracked(job) for job in jobs.values())
