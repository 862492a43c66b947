"""The autoscaler's plan: which instances to create this round (pure: no clock, no I/O).

After the seed (``hail-batch-design.rst``, "Autoscaler"), run every round (the reference: 15 s),
per pool (a shared instance collection, :class:`PoolConfig`):

1. fair share (:func:`core.fair_share.fair_share`) splits the cores the pool could offer within
   the window (free cores of its instances plus the instances it may still create in
   ``rounds_per_window`` rounds) across the users with ready jobs; each user's share out of 300
   follows (:func:`core.fair_share.autoscaler_shares`);
2. each user contributes the head of its ready queue, in (batch, job) order: at most
   ``max(1, share * window_jobs_per_user // 300)`` jobs, and no more once the cores read reach
   the user's fair-share allocation (jobs past it could not start within the window anyway;
   this bounds the work of a round by the capacity, not by the queue);
3. each job is put in a region: the first region of the pool (in the pool's order) that the job
   allows and whose remaining free cores hold it, else the first region it allows. The free
   cores of that region pay for the job as far as they go, the rest is the region's deficit;
4. each region wants ``ceil(deficit / worker cores)`` new instances; the pool creates at most
   ``max_new_per_round`` of them (the rate limit) and never grows past ``max_instances``,
   taking regions in turn so a small rate limit starves none of them.

Supply is the free cores of the pool's instances that are active or still being created
(requested or created, not yet active); deactivated instances take no new jobs and count only
towards ``max_instances``. A job whose regions include none of the pool's regions is
unschedulable by region in that pool, and a job that needs more cores than a worker has can
never fit one: neither contributes anything (the scheduler can never place them there).

The job-private collection (:data:`core.resources.JOB_PRIVATE`) gives each ready job an instance
of exactly its cores (:class:`JobPrivateConfig`), unless an instance of that collection that is
being created or is active, not deactivated, in a region the job allows and with enough free
cores is not yet claimed by an earlier job of the round. Users take turns, one job at a time in
name order, so the rate limit (``max_new_per_round``) is shared; ``max_instances`` bounds the
collection as it bounds a pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Final

from core.fair_share import (
    AUTOSCALER_SHARE_TOTAL,
    AUTOSCALER_WINDOW_SECS,
    UserDemand,
    autoscaler_shares,
    fair_share,
)
from core.resources import JOB_PRIVATE
from core.scheduler_state import Instance, Job, SchedulerState

AUTOSCALER_PERIOD_SECS: Final = 15
"""The seed's autoscaler runs every 15 seconds."""

ROUNDS_PER_WINDOW: Final = AUTOSCALER_WINDOW_SECS // AUTOSCALER_PERIOD_SECS
"""Autoscaler rounds within the seed's 2.5-minute window (10)."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """What the autoscaler needs to know about one pool (a shared instance collection).

    Not :class:`core.resources.PoolConfig`, which describes the jobs a pool accepts; this one
    describes the instances it may create.
    """

    name: str
    """The instance collection, e.g. ``"standard"`` or ``"highcpu-np"``."""
    worker_cores_mcpu: int
    max_instances: int
    """Instances of the pool (in any state until deleted) never exceed this."""
    max_new_per_round: int
    """The rate limit: instances requested per round at most."""
    regions: tuple[str, ...]
    """Regions the pool serves, in order of preference; the first is the default region."""
    machine_type: str
    preemptible: bool

    def __post_init__(self) -> None:
        """Refuse a pool that could never host a job."""
        if self.worker_cores_mcpu <= 0 or not self.regions:
            raise ValueError(f"pool {self.name!r} needs positive worker cores and a region")


@dataclass(frozen=True, slots=True)
class JobPrivateConfig:
    """The job-private collection: one instance per job, of exactly the job's cores.

    The scheduler state keeps neither a job's machine type nor its preemptibility (to keep a job
    small), so ``machine_type_for`` names the machine from the job's cores (by default every
    instance's machine type is :data:`core.resources.JOB_PRIVATE`, which the local driver
    accepts) and ``preemptible`` applies to every job-private instance.
    """

    max_instances: int
    max_new_per_round: int
    region: str
    """Where a job that allows any region gets its instance."""
    machine_type_for: Callable[[int], str] | None = None
    """The machine type for a job of ``cores_mcpu``; None for :data:`JOB_PRIVATE`."""
    preemptible: bool = True
    inst_coll: str = JOB_PRIVATE


@dataclass(frozen=True, slots=True)
class InstanceWant:
    """One instance the autoscaler wants created (the caller publishes ``InstanceRequested``)."""

    inst_coll: str
    region: str
    cores_mcpu: int
    machine_type: str
    preemptible: bool
    job: tuple[int, int] | None = None
    """(batch id, job id) of the job a job-private instance is for; None for a pool's."""


def plan(
    state: SchedulerState,
    pools: Mapping[str, PoolConfig],
    *,
    window_jobs_per_user: int,
    job_private: JobPrivateConfig | None,
    rounds_per_window: int = ROUNDS_PER_WINDOW,
) -> list[InstanceWant]:
    """The instances to create this round (see the module docstring for the method).

    Args:
        state: The folded state (not changed).
        pools: The pools by name (each key is its pool's ``name``); ready jobs of collections
            not named here (and not job-private) are not provisioned for.
        window_jobs_per_user: Jobs the scheduler could start for one user within the window;
            a user with share ``s`` (out of 300) contributes ``max(1, s * this // 300)`` jobs.
        job_private: The job-private collection, or None to create no job-private instances.
        rounds_per_window: Autoscaler rounds within the window; with ``max_new_per_round`` it
            bounds the cores a pool could offer, which fair share splits between users.

    Returns:
        The wanted instances, pools in name order and the job-private collection last.

    Raises:
        ValueError: A key of ``pools`` is not its pool's name.

    """
    by_coll: dict[str, list[Instance]] = {}
    for _, inst in sorted(state.instances.items()):
        by_coll.setdefault(inst.inst_coll, []).append(inst)
    users_by_coll: dict[str, list[str]] = {}
    for (user, inst_coll), queue in sorted(state.ready.items()):
        if len(queue):
            users_by_coll.setdefault(inst_coll, []).append(user)
    wants: list[InstanceWant] = []
    for name in sorted(pools):
        pool = pools[name]
        if pool.name != name:
            raise ValueError(f"pool {pool.name!r} is keyed as {name!r}")
        users = users_by_coll.get(name)
        if users:
            wants += _plan_pool(state, pool, users, by_coll.get(name, []),
                                window_jobs_per_user, rounds_per_window)
    if job_private is not None:
        users = users_by_coll.get(job_private.inst_coll)
        if users:
            wants += _plan_job_private(state, job_private, users,
                                       by_coll.get(job_private.inst_coll, []),
                                       window_jobs_per_user)
    return wants


def _plan_pool(state: SchedulerState, pool: PoolConfig, users: list[str],
               instances: list[Instance], window_jobs: int, rounds: int) -> list[InstanceWant]:
    supply = dict.fromkeys(pool.regions, 0)
    for inst in instances:
        if not inst.deactivated and inst.region in supply:
            supply[inst.region] += max(inst.free_mcpu, 0)
    headroom = max(0, pool.max_instances - len(instances))
    budget = min(pool.max_new_per_round, headroom)
    if budget <= 0:
        return []
    future = sum(supply.values()) + min(pool.max_new_per_round * rounds, headroom) * (
        pool.worker_cores_mcpu)
    allocations = fair_share(future, {
        u: UserDemand(state.ready_mcpu.get((u, pool.name), 0),
                      state.running_mcpu.get((u, pool.name), 0)) for u in users})
    shares = autoscaler_shares(allocations)
    deficit = dict.fromkeys(pool.regions, 0)
    for user in users:
        n = max(1, shares.get(user, 0) * window_jobs // AUTOSCALER_SHARE_TOTAL)
        read = 0
        for i, job in enumerate(_head(state, user, pool.name, n)):
            if i and read >= allocations[user]:
                break  # the user's allocation is covered: later jobs wait past the window
            read += job.cores_mcpu
            if job.cores_mcpu > pool.worker_cores_mcpu:
                continue  # never fits a worker: the scheduler ends it as unschedulable
            allowed = _allowed(pool.regions, job.regions)
            if not allowed:
                continue  # unschedulable by region in this pool
            region = next((r for r in allowed if supply[r] >= job.cores_mcpu), allowed[0])
            paid = min(job.cores_mcpu, supply[region])
            supply[region] -= paid
            deficit[region] += job.cores_mcpu - paid
    need = {r: -(-d // pool.worker_cores_mcpu) for r, d in deficit.items()}
    wants: list[InstanceWant] = []
    while budget > 0 and any(need.values()):
        for region in pool.regions:  # regions in turn: the rate limit starves none of them
            if budget > 0 and need[region] > 0:
                need[region] -= 1
                budget -= 1
                wants.append(InstanceWant(pool.name, region, pool.worker_cores_mcpu,
                                          pool.machine_type, pool.preemptible))
    return wants


def _plan_job_private(state: SchedulerState, config: JobPrivateConfig, users: list[str],
                      instances: list[Instance], window_jobs: int) -> list[InstanceWant]:
    budget = min(config.max_new_per_round, max(0, config.max_instances - len(instances)))
    free = [inst for inst in instances if not inst.deactivated and inst.free_mcpu > 0]
    wants: list[InstanceWant] = []
    heads = [_keyed_head(state, u, config.inst_coll, window_jobs) for u in users]
    for batch_id, job_id, job in _round_robin(heads):
        if budget <= 0:
            break  # later jobs could only claim instances: nothing more to create
        fits = [i for i in free if i.free_mcpu >= job.cores_mcpu and (
            not job.regions or i.region in job.regions)]
        if fits:  # the smallest instance that holds the job, so big ones stay for big jobs
            free.remove(min(fits, key=lambda i: i.free_mcpu))
            continue
        budget -= 1
        region = config.region if not job.regions or config.region in job.regions else (
            job.regions[0])
        machine_type = (JOB_PRIVATE if config.machine_type_for is None
                        else config.machine_type_for(job.cores_mcpu))
        wants.append(InstanceWant(config.inst_coll, region, job.cores_mcpu, machine_type,
                                  config.preemptible, (batch_id, job_id)))
    return wants


def _allowed(pool_regions: tuple[str, ...], job_regions: tuple[str, ...] | None
             ) -> tuple[str, ...]:
    """The pool's regions the job may run in, in the pool's order (all when it allows any)."""
    if not job_regions:
        return pool_regions
    return tuple(r for r in pool_regions if r in job_regions)


def _head(state: SchedulerState, user: str, inst_coll: str, n: int) -> Iterator[Job]:
    for _, _, job in _keyed_head(state, user, inst_coll, n):
        yield job


def _keyed_head(state: SchedulerState, user: str, inst_coll: str, n: int
                ) -> Iterator[tuple[int, int, Job]]:
    """The first ``n`` ready jobs of a user's queue, in (batch, job) order."""
    for batch_id, job_id in islice(state.ready[(user, inst_coll)], max(n, 0)):
        yield batch_id, job_id, state.batches[batch_id].jobs[job_id]


def _round_robin(heads: list[Iterator[tuple[int, int, Job]]]
                 ) -> Iterator[tuple[int, int, Job]]:
    """One job of each user in turn, so the rate limit is shared between users."""
    active = list(heads)
    while active:
        still: list[Iterator[tuple[int, int, Job]]] = []
        for head in active:
            item = next(head, None)
            if item is not None:
                yield item
                still.append(head)
        active = still
