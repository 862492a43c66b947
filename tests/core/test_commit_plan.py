"""The commit planned from staged counts equals the job-by-job statement of the rules.

The reference below decides each job of the update from its parents' states
(:func:`core.projection.commit.initial_states`) and counts it, as the commit did when it read and
rewrote every job row. The plan under test only sees what the bunches staged per group and
instance collection, plus the jobs whose earlier-update parents had ended; counters and final
job states must come out the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from core.projection.commit import (
    BatchBefore,
    CommitJob,
    Resolved,
    StagedCounts,
    StagedJob,
    initial_states,
    plan_commit,
    stage_heads,
    stage_jobs,
    start_of,
)
from core.projection.counters import CANCELLABLE, JOB_COUNTS, STAGED, USER_RESOURCES
from core.projection.execution import Child, JobFacts
from core.projection.ops import Increment, Increments
from schemas.base import JobResources, JobState
from schemas.batch import JobHead

TOKEN, USER, BATCH = 3, "u", 9
ENDED: tuple[JobState, ...] = ("Success", "Failed", "Error", "Cancelled")
LIVE: tuple[JobState, ...] = ("Pending", "Ready", "Running")
# Groups: 0 is the batch; 1 and 2 are its children; 3 is a child of 1.
ANCESTORS = {0: [0], 1: [1, 0], 2: [2, 0], 3: [3, 1, 0]}


@dataclass(frozen=True)
class NewJob:
    job_id: int
    group: int
    inst_coll: str
    cores: int
    always_run: bool
    parents: tuple[int, ...]


@st.composite
def updates(draw: st.DrawFn) -> tuple[dict[int, JobState], list[NewJob], frozenset[int]]:
    n_earlier = draw(st.integers(0, 6))
    earlier = {j: draw(st.sampled_from(ENDED + LIVE)) for j in range(1, n_earlier + 1)}
    jobs = []
    for job_id in range(n_earlier + 1, n_earlier + 1 + draw(st.integers(0, 12))):
        candidates = list(range(1, job_id))
        parents = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3)
                       ) if candidates else []
        jobs.append(NewJob(job_id, draw(st.sampled_from(sorted(ANCESTORS))),
                           draw(st.sampled_from(["standard", "highmem"])),
                           draw(st.sampled_from([250, 1000])), draw(st.booleans()),
                           tuple(sorted(parents))))
    cancelled = draw(st.sets(st.sampled_from(sorted(ANCESTORS))))
    # A cancelled group's descendants are cancelled too (as job_groups_cancelled has them).
    closed = frozenset(g for g, chain in ANCESTORS.items() if cancelled & set(chain))
    return earlier, jobs, closed


def reference(earlier: dict[int, JobState], jobs: Sequence[NewJob], cancelled: frozenset[int]
              ) -> tuple[list[Increment], dict[int, tuple[str, int, bool]]]:
    """The counters and (state, pending parents, effectively cancelled) of each job, job by
    job: what the commit computed before staging existed."""
    commit_jobs = [CommitJob(j.job_id, j.group, j.inst_coll, j.cores, j.always_run)
                   for j in jobs]
    edges = [(j.job_id, p) for j in jobs for p in j.parents]
    starts = initial_states(commit_jobs, edges, earlier, cancelled)
    acc = Increments()
    for j, s in zip(jobs, starts, strict=True):
        column = "n_ready" if s.state == "Ready" else "n_pending"
        for g in ANCESTORS[j.group]:
            acc.add(Increment(JOB_COUNTS, {"batch_id": BATCH, "job_group_id": g},
                              {"n_jobs": 1, column: 1}))
        if s.state != "Ready":
            continue
        key = {"user": USER, "inst_coll": j.inst_coll, "token": TOKEN}
        if s.cancelled:
            acc.add(Increment(USER_RESOURCES, key, {"n_cancelled_ready_jobs": 1}))
            continue
        acc.add(Increment(USER_RESOURCES, key, {"n_ready_jobs": 1, "ready_cores_mcpu": j.cores}))
        if not j.always_run:
            acc.add(Increment(CANCELLABLE, {"batch_id": BATCH, "job_group_id": j.group,
                                            "inst_coll": j.inst_coll, "token": TOKEN},
                              {"n_ready_cancellable_jobs": 1,
                               "ready_cancellable_cores_mcpu": j.cores}))
    states = {s.job_id: (s.state, s.n_pending_parents, s.cancelled) for s in starts}
    return acc.drain(), states


def staged(jobs: Sequence[NewJob]) -> list[StagedCounts]:
    """What the bunches staged, read back as the commit reads the table."""
    rows: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for inc in stage_jobs(BATCH, 1, [StagedJob(j.group, j.inst_coll, j.cores, j.always_run,
                                               len(j.parents)) for j in jobs]):
        assert inc.table == STAGED
        row = rows[(int(inc.key["job_group_id"] or 0), str(inc.key["inst_coll"]))]
        for column, delta in inc.deltas.items():
            row[column] += delta
    return [StagedCounts(g, ic, r["n_jobs"], r["n_ready"], r["ready_cores_mcpu"],
                         r["n_ready_always_run"], r["ready_always_run_cores_mcpu"])
            for (g, ic), r in sorted(rows.items())]


@settings(max_examples=400)
@given(updates())
def test_the_staged_commit_equals_the_job_by_job_one(
        case: tuple[dict[int, JobState], list[NewJob], frozenset[int]]) -> None:
    earlier, jobs, cancelled = case
    expected_counters, expected_states = reference(earlier, jobs, cancelled)
    resolved = []
    for j in jobs:
        ended = tuple(earlier[p] for p in j.parents if p in earlier and earlier[p] in ENDED)
        if ended:
            state, pending = start_of(j.parents)
            facts = JobFacts(BATCH, j.job_id, j.group, USER, j.inst_coll, j.cores, j.always_run,
                             not j.always_run and j.group in cancelled)
            resolved.append(Resolved(Child(facts, state, pending), ended))
    plan = plan_commit(
        batch=BatchBefore(BATCH, USER, n_jobs=len(earlier), n_completed=0, time_closed_ms=None),
        staged=staged(jobs), resolved=resolved, cancelled_groups=cancelled,
        ancestors=ANCESTORS, update_groups=[], token=TOKEN, now_ms=1)
    assert plan.increments == expected_counters
    released = {r.job_id: r for r in plan.releases}
    for j in jobs:
        state, pending = start_of(j.parents)
        flagged = False
        if j.job_id in released:
            r = released[j.job_id]
            state, pending, flagged = r.state, r.n_pending_parents, r.cancelled_flag
        effective = not j.always_run and (flagged or j.group in cancelled)
        assert expected_states[j.job_id] == (state, pending, effective), j
    assert plan.batch.values["n_jobs"] == len(earlier) + len(jobs)


def test_an_update_of_no_jobs_completes_a_batch_whose_jobs_all_ended() -> None:
    plan = plan_commit(
        batch=BatchBefore(BATCH, USER, n_jobs=2, n_completed=2, time_closed_ms=5),
        staged=[], resolved=[], cancelled_groups=frozenset(), ancestors=ANCESTORS,
        update_groups=[2], token=TOKEN, now_ms=7)
    assert plan.batch.values == {"n_jobs": 2, "state": "complete", "time_closed_ms": 5,
                                 "time_completed_ms": 7}
    assert [(g.where["job_group_id"], g.values["state"]) for g in plan.groups] == [
        (0, "complete"), (2, "complete")]
    assert plan.increments == [] and plan.releases == []


heads = st.lists(st.builds(
    JobHead, job_id=st.integers(1, 10**6), job_group_id=st.integers(0, 3),
    parent_ids=st.lists(st.integers(1, 50), max_size=3), always_run=st.booleans(),
    resources=st.builds(JobResources, cores_mcpu=st.sampled_from([250, 1000, 16_000]),
                        memory_bytes=st.just(1 << 30)),
    inst_coll=st.sampled_from(["standard", "highmem"])), max_size=30)


@given(heads)
def test_a_bunch_is_staged_as_its_jobs_one_by_one(jobs: list[JobHead]) -> None:
    """Counting a bunch's jobs as the log carries them stages what a StagedJob per job does."""
    assert stage_heads(BATCH, 1, jobs) == stage_jobs(BATCH, 1, [
        StagedJob(j.job_group_id, j.inst_coll, j.resources.cores_mcpu, j.always_run,
                  len(j.parent_ids)) for j in jobs])
