from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.autoscale import InstanceWant, JobPrivateConfig, PoolConfig, plan
from core.resources import JOB_PRIVATE
from core.scheduler_state import Job, SchedulerState, fold
from schemas.events import AnyEvent
from schemas.infra import InstanceActivated, InstanceDeactivated, InstanceRequested
from tests.core.test_scheduler_state import committed, created, instance, jr, sj, submitted

US_EU = ("us", "eu")


def pool(name: str = "standard", *, cores: int = 4000, max_instances: int = 100,
         max_new: int = 10, regions: tuple[str, ...] = US_EU) -> PoolConfig:
    return PoolConfig(name=name, worker_cores_mcpu=cores, max_instances=max_instances,
                      max_new_per_round=max_new, regions=regions, machine_type=f"m-{name}",
                      preemptible=True)


def private(*, max_instances: int = 100, max_new: int = 10) -> JobPrivateConfig:
    return JobPrivateConfig(max_instances=max_instances, max_new_per_round=max_new, region="us")


def jobs(b: int, n: int, *, user: str = "alice", cores: int = 1000, ic: str = "standard",
         regions: list[str] | None = None) -> list[AnyEvent]:
    return [created(b, user),
            submitted(b, 1, *(jr(j, cores=cores, ic=ic, regions=regions)
                              for j in range(1, n + 1))),
            committed(b, 1)]


def requested(name: str, *, ic: str = "standard", region: str = "us", cores: int = 4000
              ) -> InstanceRequested:
    return InstanceRequested(instance_name=name, inst_coll=ic, machine_type="m", region=region,
                             cores_mcpu=cores, preemptible=True)


def run(events: Sequence[AnyEvent], pools: Sequence[PoolConfig] = (pool(),), *,
        window: int = 1000, job_private: JobPrivateConfig | None = None,
        rounds: int = 10) -> list[InstanceWant]:
    return plan(fold(events), {p.name: p for p in pools}, window_jobs_per_user=window,
                job_private=job_private, rounds_per_window=rounds)


def regions_of(wants: list[InstanceWant]) -> list[str]:
    return [w.region for w in wants]


# --- pools --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("events", "expected"), [
    ([], []),
    (jobs(1, 4, ic="highmem"), []),
    (jobs(1, 10), ["us"] * 3),
    (jobs(1, 4, cores=8000), []),
    ([*jobs(1, 4), *instance("i1", region="us")], []),
    ([*jobs(1, 4), *instance("i1", region="eu")], []),
    ([*jobs(1, 4), requested("i1")], []),
    ([*jobs(1, 5), requested("i1")], ["us"]),
    ([*jobs(1, 4), *instance("i1", region="us"),
      InstanceDeactivated(instance_name="i1", reason="idle")],
     ["us"]),
    ([*jobs(1, 4, regions=["eu"])], ["eu"]),
    ([*jobs(1, 4, regions=["eu"]), *instance("i1", region="us")], ["eu"]),
    ([*jobs(1, 4, regions=["asia"])], []),
    ([*jobs(1, 2, regions=["us", "eu"]), *instance("i1", region="eu", cores=2000)], []),
    ([*jobs(1, 5, cores=1000), *instance("i1", region="us"), sj(1, 1, inst="i1")], ["us"]),
], ids=["nothing", "no-pool", "ceil", "too-big", "free-us", "free-eu-for-any-region",
        "being-created", "being-created-short", "deactivated-is-no-supply", "region",
        "region-other-supply", "region-outside-pool", "region-supply-first-fit",
        "used-cores-are-not-free"])
def test_pool_examples(events: list[AnyEvent], expected: list[str]) -> None:
    wants = run(events)
    assert regions_of(wants) == expected
    assert all(w == InstanceWant("standard", w.region, 4000, "m-standard", True) for w in wants)


@pytest.mark.parametrize(("cfg", "existing", "expected"), [
    (pool(max_new=2), 0, 2),
    (pool(max_instances=3), 2, 1),
    (pool(max_instances=2), 2, 0),
    (pool(max_instances=1), 2, 0),
    (pool(max_new=0), 0, 0),
], ids=["rate-limit", "max-instances", "full", "over-full", "no-creation"])
def test_limits(cfg: PoolConfig, existing: int, expected: int) -> None:
    full = [e for i in range(existing) for e in instance(f"i{i}", cores=1000)]
    events = [*jobs(1, 40), *full, *(sj(1, 40 - i, f"x{i}", f"i{i}") for i in range(existing))]
    assert len(run(events, [cfg])) == expected


def test_the_rate_limit_takes_regions_in_turn() -> None:
    events = [*jobs(1, 8, cores=4000, regions=["eu"]),
              *jobs(2, 8, cores=4000, regions=["us"], user="bob")]
    assert regions_of(run(events, [pool(max_new=3)])) == ["us", "eu", "us"]


def test_each_user_contributes_the_head_of_its_queue() -> None:
    events = [*jobs(1, 100), *jobs(2, 100, user="bob")]
    # One user's share is 150 of 300: 150 * 16 // 300 = 8 jobs each, 16 cores, 4 instances.
    assert len(run(events, window=16)) == 4
    # A window of nothing still looks at one job of each user.
    assert len(run(events, window=0)) == 1


def test_fair_share_weighs_the_users_heads() -> None:
    # alice runs 16 cores on 4 full instances; bob runs nothing. With 40 cores to come, fair
    # share gives bob 28 and alice 12: shares 210 and 90, so 7 of bob's 1-core jobs and 3 of
    # alice's 4-core jobs fit the window of 10: 19 cores, 5 instances (equal shares: 7).
    running = [e for i in range(4) for e in instance(f"i{i}")]
    events = [*jobs(1, 24, cores=4000), *running,
              *(sj(1, 21 + i, f"x{i}", f"i{i}", cores=4000) for i in range(4)),
              *jobs(2, 40, cores=1000, user="bob")]
    assert len(run(events, [pool(max_new=10)], window=10, rounds=1)) == 5


def test_jobs_past_the_users_allocation_are_not_read() -> None:
    # Two new 4-core instances are all the window offers (rounds=1): the user's allocation is
    # 8 cores, so its 8 us jobs use it up and its eu jobs behind them wait for a later round.
    records = [jr(j, regions=["us"] if j <= 8 else ["eu"]) for j in range(1, 41)]
    events: list[AnyEvent] = [created(1), submitted(1, 1, *records), committed(1, 1)]
    assert regions_of(run(events, [pool(max_new=2)], window=10**6, rounds=1)) == ["us", "us"]
    # A longer window offers more: the eu jobs count too and the regions take turns.
    assert regions_of(run(events, [pool(max_new=2)], window=10**6, rounds=10)) == ["us", "eu"]


def test_pools_are_planned_apart_and_in_name_order() -> None:
    events = [*jobs(1, 4, ic="highmem"), *jobs(2, 4, user="bob")]
    wants = run(events, [pool("standard"), pool("highmem", regions=("eu",))])
    assert [(w.inst_coll, w.region, w.machine_type) for w in wants] == [
        ("highmem", "eu", "m-highmem"), ("standard", "us", "m-standard")]


def test_misconfigured_pools_are_refused() -> None:
    with pytest.raises(ValueError, match="keyed"):
        plan(SchedulerState(), {"other": pool()}, window_jobs_per_user=1, job_private=None)
    with pytest.raises(ValueError, match="worker cores"):
        pool(cores=0)
    with pytest.raises(ValueError, match="region"):
        pool(regions=())


# --- job-private ----------------------------------------------------------------------------------

def pj(b: int, n: int, *, user: str = "alice", regions: list[str] | None = None
       ) -> list[AnyEvent]:
    return jobs(b, n, user=user, ic=JOB_PRIVATE, cores=8000, regions=regions)


@pytest.mark.parametrize(("events", "expected"), [
    (pj(1, 2), [((1, 1), "us", 8000), ((1, 2), "us", 8000)]),
    (pj(1, 1, regions=["eu"]), [((1, 1), "eu", 8000)]),
    ([*pj(1, 2), requested("p1", ic=JOB_PRIVATE, cores=8000)], [((1, 2), "us", 8000)]),
    ([*pj(1, 1), requested("p1", ic=JOB_PRIVATE, cores=4000)], [((1, 1), "us", 8000)]),
    ([*pj(1, 1, regions=["eu"]), requested("p1", ic=JOB_PRIVATE, cores=8000)],
     [((1, 1), "eu", 8000)]),
    ([*pj(1, 1), requested("p1", ic=JOB_PRIVATE, cores=8000),
      InstanceActivated(instance_name="p1", address="x", cores_mcpu=8000),
      InstanceDeactivated(instance_name="p1", reason="idle")], [((1, 1), "us", 8000)]),
    ([*pj(1, 1), requested("p1", ic=JOB_PRIVATE, cores=16_000)], []),
    (jobs(1, 2), []),
], ids=["one-each", "region", "being-created", "too-small", "other-region", "deactivated",
        "bigger-is-fine", "pool-jobs"])
def test_job_private(events: list[AnyEvent], expected: list[tuple[tuple[int, int], str, int]]
                     ) -> None:
    wants = run(events, [], job_private=private())
    assert [(w.job, w.region, w.cores_mcpu) for w in wants] == expected
    assert all(w.inst_coll == JOB_PRIVATE and w.machine_type == JOB_PRIVATE for w in wants)
    assert run(events, [], job_private=None) == []


def test_job_private_limits_share_the_round_between_users() -> None:
    events = [*pj(1, 3), *pj(2, 3, user="bob")]
    wants = run(events, [], job_private=private(max_new=3))
    assert [w.job for w in wants] == [(1, 1), (2, 1), (1, 2)]
    existing = [requested(f"p{i}", ic=JOB_PRIVATE, cores=1000) for i in range(4)]
    assert len(run([*events, *existing], [], job_private=private(max_instances=5))) == 1


def test_job_private_machine_type_is_injected() -> None:
    cfg = JobPrivateConfig(max_instances=1, max_new_per_round=1, region="us",
                           machine_type_for=lambda mcpu: f"n1-standard-{mcpu // 1000}",
                           preemptible=False)
    [want] = run(pj(1, 1), [], job_private=cfg)
    assert (want.machine_type, want.preemptible) == ("n1-standard-8", False)


# --- properties ---------------------------------------------------------------------------------

COLLS = ("standard", "highmem", JOB_PRIVATE)
REGIONS = ("us", "eu", "asia")


ANY_REGIONS = st.sampled_from([None, ["us"], ["eu"], ["us", "eu"], ["asia"]])


@st.composite
def histories(draw: st.DrawFn, *, with_jobs: bool = True,
              job_regions: st.SearchStrategy[list[str] | None] = ANY_REGIONS) -> list[AnyEvent]:
    """Batches of ready (and some running) jobs and instances in every state."""
    events: list[AnyEvent] = []
    names = itertools.count()
    inst_states: dict[str, tuple[str, str, int]] = {}
    for _ in range(draw(st.integers(0, 6))):
        name = f"i{next(names)}"
        ic = draw(st.sampled_from(COLLS))
        region = draw(st.sampled_from(REGIONS))
        cores = draw(st.sampled_from([1000, 2000, 4000, 8000]))
        phase = draw(st.sampled_from(["requested", "active", "deactivated"]))
        events.append(requested(name, ic=ic, region=region, cores=cores))
        if phase != "requested":
            events.append(InstanceActivated(instance_name=name, address="x", cores_mcpu=cores))
        if phase == "deactivated":
            events.append(InstanceDeactivated(instance_name=name, reason="idle"))
        inst_states[name] = (ic, phase, cores)
    n_batches = draw(st.integers(1, 4)) if with_jobs else 0
    for b in range(1, n_batches + 1):
        records = [jr(j, cores=draw(st.sampled_from([250, 1000, 2000, 4000, 8000])),
                      ic=draw(st.sampled_from(COLLS)),
                      regions=draw(job_regions))
                   for j in range(1, draw(st.integers(1, 12)) + 1)]
        events += [created(b, draw(st.sampled_from(["alice", "bob", "carol"]))),
                   submitted(b, 1, *records), committed(b, 1)]
        free = {n: c for n, (_, phase, c) in inst_states.items() if phase == "active"}
        for r in records:  # some jobs run, on instances with room for them
            fits = [n for n, c in free.items() if c >= r.resources.cores_mcpu]
            if len(fits) > 0 and draw(st.booleans()):
                n = draw(st.sampled_from(fits))
                free[n] -= r.resources.cores_mcpu
                events.append(sj(b, r.job_id, f"a{b}-{r.job_id}", n, r.resources.cores_mcpu))
    return events


pool_configs = st.builds(
    lambda name, cores, mx, new, regions: PoolConfig(
        name=name, worker_cores_mcpu=cores, max_instances=mx, max_new_per_round=new,
        regions=regions, machine_type="m", preemptible=True),
    st.just("standard"), st.sampled_from([2000, 4000, 8000]), st.integers(0, 6),
    st.integers(0, 4), st.sampled_from([("us",), ("eu",), ("us", "eu"), ("eu", "us")]))
private_configs = st.none() | st.builds(
    lambda mx, new, region: JobPrivateConfig(max_instances=mx, max_new_per_round=new,
                                             region=region),
    st.integers(0, 6), st.integers(0, 4), st.sampled_from(["us", "eu"]))


def ready_jobs(state: SchedulerState, inst_coll: str) -> list[Job]:
    return [state.batches[b].jobs[j] for (_, c), q in sorted(state.ready.items())
            if c == inst_coll for b, j in q]


def existing(state: SchedulerState, inst_coll: str) -> int:
    return sum(i.inst_coll == inst_coll for i in state.instances.values())


@settings(max_examples=200, deadline=None)
@given(histories(), pool_configs, pool_configs, private_configs, st.integers(0, 50))
def test_plans_respect_limits_and_regions(events: list[AnyEvent], standard: PoolConfig,
                                          highmem: PoolConfig, jp: JobPrivateConfig | None,
                                          window: int) -> None:
    highmem = dataclasses.replace(highmem, name="highmem")
    pools = {"standard": standard, "highmem": highmem}
    state = fold(events)
    wants = plan(state, pools, window_jobs_per_user=window, job_private=jp)
    per_coll = Counter(w.inst_coll for w in wants)
    limits = {**{n: (p.max_instances, p.max_new_per_round) for n, p in pools.items()},
              **({JOB_PRIVATE: (jp.max_instances, jp.max_new_per_round)} if jp else {})}
    for ic, n in per_coll.items():
        assert ic in limits
        max_instances, max_new = limits[ic]
        assert n <= max_new
        assert n <= max(0, max_instances - existing(state, ic))
    ready = {ic: ready_jobs(state, ic) for ic in COLLS}
    for w in wants:
        assert ready[w.inst_coll], "no demand, no instance"
        if w.inst_coll == JOB_PRIVATE:
            assert jp is not None and w.job is not None
            job = state.job(*w.job)
            assert job is not None and w.job in state.ready[(state.batches[w.job[0]].user,
                                                            JOB_PRIVATE)]
            assert w.cores_mcpu == job.cores_mcpu
            assert not job.regions or w.region in job.regions
            continue
        p = pools[w.inst_coll]
        assert w.job is None and w.cores_mcpu == p.worker_cores_mcpu
        # A new instance goes to the first pool region some fitting ready job allows.
        firsts = {next((r for r in p.regions if not j.regions or r in j.regions), None)
                  for j in ready[w.inst_coll] if j.cores_mcpu <= p.worker_cores_mcpu}
        assert w.region in firsts
    private_jobs = [w.job for w in wants if w.job is not None]
    assert len(set(private_jobs)) == len(private_jobs)
    # Pure and deterministic: the state is unchanged, and the plan depends on nothing else.
    assert state == fold(events)
    assert plan(fold(events), dict(reversed(pools.items())), window_jobs_per_user=window,
                job_private=jp) == wants


@settings(max_examples=100, deadline=None)
@given(histories(with_jobs=False), pool_configs, private_configs)
def test_no_demand_no_instances(events: list[AnyEvent], cfg: PoolConfig,
                                jp: JobPrivateConfig | None) -> None:
    assert plan(fold(events), {"standard": cfg}, window_jobs_per_user=10, job_private=jp) == []


@settings(max_examples=150, deadline=None)
@given(st.data(), pool_configs, st.integers(0, 50), st.booleans())
def test_demand_covered_by_free_cores_creates_nothing(
        data: st.DataObject, cfg: PoolConfig, window: int, creating: bool) -> None:
    # An instance of the pool in a region every ready job allows, with room for all of them.
    region = data.draw(st.sampled_from(cfg.regions))
    others = [r for r in REGIONS if r != region]
    events = data.draw(histories(job_regions=st.sampled_from(
        [None, [region], sorted([region, others[0]]), sorted([region, *others])])))
    cores = sum(j.cores_mcpu for j in ready_jobs(fold(events), "standard")) + 1000
    events = [*events, requested("big", region=region, cores=cores)]
    if not creating:
        events.append(InstanceActivated(instance_name="big", address="x", cores_mcpu=cores))
    wants = plan(fold(events), {"standard": cfg}, window_jobs_per_user=window, job_private=None)
    assert wants == []


@settings(max_examples=150, deadline=None)
@given(st.data(), pool_configs, st.sampled_from(REGIONS))
def test_jobs_of_one_region_get_instances_there_only(data: st.DataObject, cfg: PoolConfig,
                                                     region: str) -> None:
    state = fold(data.draw(histories(job_regions=st.just([region]))))
    wants = plan(state, {"standard": cfg}, window_jobs_per_user=50, job_private=None)
    assert all(w.region == region for w in wants)
    if region not in cfg.regions:
        assert wants == []
