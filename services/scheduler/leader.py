"""The elected scheduler's rounds: cancel, schedule, deliver, and look after instances.

Each round reads the folded state, asks the pure core what to do, publishes the resulting
events with the leader's epoch, and folds them into its own state at once (every fold is
idempotent, so reading them back from the log later changes nothing). Only then does it touch
the outside world: deliveries and kills to workers, creates and deletes to the compute driver,
all idempotent by attempt or instance name, so a round cut short by a crash is simply redone by
the next leader.

A round, as in the reference's driver loops:

1. groups over their ``cancel_after_n_failures`` are cancelled;
2. the canceller ends cancelled Ready jobs and kills cancelled Running ones, fairly across users;
3. the scheduling step places Ready jobs (fair share, then tiers, then first fit) and the SJs
   are delivered with a short timeout; a worker that refuses one makes the attempt lost (a new
   attempt follows), a worker that does not answer gets the same attempt again later; what
   changed in why ready jobs wait (:mod:`core.waiting`) is published at most every
   ``waiting_s`` (``scheduler.waiting_reasons``, bounded, changes only);
4. every ``autoscale_s``: lost and never-activated instances are deleted (their attempts lost),
   idle ones deactivated and deleted, and the autoscaler's plan is created;
5. every ``budget_s``: batches of billing projects at or over their limit are cancelled.

SJs carry what their attempt is billed for (:func:`core.billing.attempt_resources`, at the latest
version of each product folded from the control topic), so billing replays exactly.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Self

import msgspec
import sqlalchemy as sa

from core.autoscale import JobPrivateConfig, PoolConfig, plan
from core.billing import attempt_resources
from core.policy import Tiers
from core.resources import JOB_PRIVATE, default_config
from core.scheduler_state import SchedulerState
from core.scheduling import bunches, cancellations, failure_cancellations, schedule
from core.waiting import Published, Waiting, WaitingKey, apply_published, changes_event
from schemas.batch import BatchCancelled
from schemas.events import AnyEvent
from schemas.execution import AttemptLost, JobScheduled
from schemas.infra import InstanceCreated, InstanceDeactivated, InstanceDeleted, InstanceRequested
from services.common.log import LogError, Publisher, now_ms
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.budget import Budgets
from services.scheduler.dispatch import Attempt, Delivery, WorkerClient
from services.scheduler.drivers import ComputeDriver, InstanceSpec
from services.scheduler.policy import PriorityPolicy, QuotaSettings, parse_quotas
from services.scheduler.settings import SchedulerSettings
from services.scheduler.view import View

log = logging.getLogger(__name__)

JobKey = tuple[int, int]


def pools_for(sched: SchedulerSettings) -> dict[str, PoolConfig]:
    """The autoscaler's pools: the reference's pools on ``worker_cores``-core workers."""
    config = default_config(worker_cores=sched.worker_cores)
    return {p.name: PoolConfig(
        name=p.name, worker_cores_mcpu=p.worker_cores * 1000, max_instances=sched.max_instances,
        max_new_per_round=sched.max_new_per_round, regions=p.regions,
        machine_type=f"local-{p.name}-{p.worker_cores}", preemptible=p.preemptible)
        for p in config.pools}


class Leader:
    """The acting scheduler of one epoch; an async context manager (see the module docstring)."""

    def __init__(self, view: View, sched: SchedulerSettings, driver: ComputeDriver,
                 publisher: Publisher, *, clock: Callable[[], float] = time.monotonic,
                 budgets: Budgets | None = None) -> None:
        self._view = view
        self._sched = sched
        self._driver = driver
        self._publisher = publisher
        self._clock = clock
        self._client = WorkerClient(timeout_s=sched.dispatch_timeout_s,
                                    concurrency=sched.dispatch_concurrency)
        self._pools = pools_for(sched)
        self._job_private = JobPrivateConfig(
            max_instances=sched.max_instances, max_new_per_round=sched.max_new_per_round,
            region=next(iter(self._pools.values())).regions[0])
        self._max_worker_mcpu = {name: p.worker_cores_mcpu for name, p in self._pools.items()}
        self._max_instances = {**{name: p.max_instances for name, p in self._pools.items()},
                               self._job_private.inst_coll: self._job_private.max_instances}
        # Why ready jobs wait: the latest step's reasons, what this epoch published of them.
        self._epoch = view.state.epoch  # the leader is made right after its election folds
        self._waiting: dict[WaitingKey, Waiting] = {}
        self._published: dict[WaitingKey, Published] = {}
        self._waiting_sent = False
        self._next_waiting = 0.0
        self._tiers = Tiers([])
        self._policy = None if sched.policy != "priority" else PriorityPolicy(
            parse_quotas(sched.quotas) if sched.quotas else {}, QuotaSettings(),
            sched.cost_per_core_s)
        self._next_priorities = 0.0
        self._delivered: dict[JobKey, tuple[str, float]] = {}
        self._killed: dict[tuple[int, int, str], float] = {}
        self._idle_since: dict[str, float] = {}
        self._seen_inactive: dict[str, float] = {}
        self._health_failures: dict[str, int] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._next_maintenance = 0.0
        self._next_redelivery = 0.0
        self._budgets = budgets
        self._next_budget = 0.0
        self._budget_cancelled: set[int] = set()
        self.rounds = 0

    async def __aenter__(self) -> Self:
        await self._client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._client.__aexit__(*exc)

    @property
    def _state(self) -> SchedulerState:
        return self._view.state

    async def run(self) -> None:
        """Rounds until cancelled; a round with nothing to do waits for the next event."""
        while True:
            self._view.changed.clear()
            started = time.perf_counter()
            try:
                busy = await self.round()
            except LogError as e:
                if not e.retryable:
                    raise
                log.warning("round failed, retrying: %s", e)
                await asyncio.sleep(1.0)
                continue
            self.rounds += 1
            scheduler_metrics.ROUND_SECONDS.observe(time.perf_counter() - started)
            if not busy:
                try:
                    async with asyncio.timeout(self._sched.idle_loop_s):
                        await self._view.changed.wait()
                except TimeoutError:
                    pass

    async def round(self) -> bool:
        """One round; True if it published anything (another round may find more to do)."""
        now = self._clock()
        if self._policy is not None and now >= self._next_priorities:
            self._next_priorities = now + self._sched.priority_s
            self._tiers = self._policy.tiers(self._state, now)
        busy = await self._emit(failure_cancellations(self._state))
        busy = await self._cancel(now) or busy
        busy = await self._schedule(now) or busy
        if now >= self._next_waiting:
            await self._publish_waiting(now)
        if now >= self._next_redelivery:
            self._next_redelivery = now + 1.0
            await self._redeliver(now)
        if now >= self._next_maintenance:
            self._next_maintenance = now + self._sched.autoscale_s
            busy = await self._maintain(now) or busy
        if self._budgets is not None and now >= self._next_budget:
            self._next_budget = now + self._sched.budget_s
            busy = await self._enforce_budgets(self._budgets) or busy
        return busy

    async def _enforce_budgets(self, budgets: Budgets) -> bool:
        """Cancel the batches of billing projects that reached their limit (once each)."""
        try:
            over = await budgets.over_limit()
        except sa.exc.SQLAlchemyError as e:
            log.warning("billing limits not checked (retrying later): %s", e)
            return False
        new = [b for b in over if b not in self._budget_cancelled]
        if new:
            log.info("cancelling batches %s: their billing projects reached their limits", new)
        self._budget_cancelled.update(new)
        return await self._emit([BatchCancelled(batch_id=b, reason="billing_limit") for b in new])

    # --- publishing --------------------------------------------------------------------------
    async def _emit(self, events: Sequence[AnyEvent]) -> bool:
        """Publish with the leader's epoch, then fold into our own state at once."""
        if not events:
            return False
        envelopes = [self._publisher.envelope(e) for e in events]
        await self._publisher.publish_many(envelopes)
        scheduler_metrics.published(events)
        for env in envelopes:
            self._view.apply_local(env)
        return True

    # --- cancelling --------------------------------------------------------------------------
    async def _cancel(self, now: float) -> bool:
        picked = cancellations(self._state)
        busy = await self._emit(picked.cancelled)
        kills = []
        for k in picked.kills:
            key = (k.batch_id, k.job_id, k.attempt_id)
            if now - self._killed.get(key, -1e18) >= self._sched.kill_repeat_s:
                self._killed[key] = now
                address = self._view.addresses.get(k.instance_name)
                if address is not None:
                    kills.append(self._client.kill(address, *key))
        await asyncio.gather(*kills)
        scheduler_metrics.cancelled("kill", len(kills))
        return busy

    # --- scheduling and delivery -------------------------------------------------------------
    async def _schedule(self, now: float) -> bool:
        decisions = schedule(self._state, self._tiers, max_jobs=self._sched.max_jobs_per_step,
                             new_attempt_id=lambda: secrets.token_hex(5),
                             max_worker_mcpu=self._max_worker_mcpu,
                             max_instances=self._max_instances)
        self._waiting = decisions.waiting
        busy = await self._emit(decisions.unschedulable)
        if not decisions.scheduled:
            return busy
        scheduled = [self._billed(sj) for sj in decisions.scheduled]
        await self._emit(bunches(scheduled))
        await self._deliver([(sj.batch_id, sj.job_id, sj.attempt_id, sj.instance_name)
                             for sj in scheduled], now)
        return True

    async def _publish_waiting(self, now: float) -> None:
        """Publish what changed in why ready jobs wait: at most every ``waiting_s``, bounded.

        The epoch's first event goes out even if empty: consumers then drop what earlier
        leaders said. Not "busy": it changes nothing the next round would act on.
        """
        self._next_waiting = now + self._sched.waiting_s  # the diff too: once per interval
        event = changes_event(self._published, self._waiting, epoch=self._epoch,
                              now_ms=now_ms(), first=not self._waiting_sent)
        if event is None:
            return
        await self._emit([event])
        apply_published(self._published, event, now_ms())
        self._waiting_sent = True

    def _billed(self, sj: JobScheduled) -> JobScheduled:
        """The SJ with what its attempt is billed for (a job-private one bills its machine)."""
        machine = self._view.machines.get(sj.instance_name)
        if machine is None:
            return sj
        cores = machine.worker_cores_mcpu if sj.inst_coll == JOB_PRIVATE else sj.cores_mcpu
        return msgspec.structs.replace(sj, resources=attempt_resources(
            cores, machine, self._view.latest_versions))

    async def _deliver(self, attempts: Sequence[tuple[int, int, str, str]], now: float) -> None:
        """Deliver attempts, one request per worker (a round places many on each)."""
        by_address: dict[str, list[tuple[int, Attempt]]] = {}
        results = [Delivery.UNKNOWN] * len(attempts)
        for i, (batch_id, job_id, attempt_id, instance) in enumerate(attempts):
            address = self._view.addresses.get(instance)
            batch = self._state.batches.get(batch_id)
            job = None if batch is None else batch.jobs.get(job_id)
            if address is None or batch is None or job is None:
                continue
            by_address.setdefault(address, []).append((i, Attempt(
                batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, user=batch.user,
                cores_mcpu=job.cores_mcpu)))
        answers = await asyncio.gather(*(
            self._client.deliver_many(address, [a for _, a in items])
            for address, items in by_address.items()))
        for items, delivered in zip(by_address.values(), answers, strict=True):
            for (i, _), result in zip(items, delivered, strict=True):
                results[i] = result
        lost = []
        for (batch_id, job_id, attempt_id, instance), result in zip(attempts, results,
                                                                    strict=True):
            self._delivered[(batch_id, job_id)] = (attempt_id, now)
            if result is Delivery.REFUSED:
                lost.append(AttemptLost(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id,
                                        instance_name=instance, reason="delivery_failed",
                                        end_time_ms=now_ms()))
        await self._emit(lost)

    async def _redeliver(self, now: float) -> None:
        """Deliver again attempts that were scheduled but have not started (idempotent)."""
        again = []
        for name, inst in self._state.instances.items():
            for batch_id, job_id, attempt_id in self._state.running_on(name):
                job = self._state.job(batch_id, job_id)
                if job is None or job.started:
                    self._delivered.pop((batch_id, job_id), None)
                    continue
                last = self._delivered.get((batch_id, job_id))
                if last is None or last[0] != attempt_id or (
                        now - last[1] >= self._sched.redeliver_s):
                    again.append((batch_id, job_id, attempt_id, name))
            del inst  # only the name is needed
        if again:
            log.info("delivering %d scheduled attempts again", len(again))
            await self._deliver(again, now)

    # --- instances ---------------------------------------------------------------------------
    async def _maintain(self, now: float) -> bool:
        state = self._state
        stopped = {i.name for i in await self._driver.list() if i.state == "stopped"}
        active = [n for n, i in state.instances.items() if i.active and n not in stopped]
        alive = await asyncio.gather(*(self._alive(n) for n in active))
        gone: dict[str, str] = {n: "worker stopped" for n in stopped if n in state.instances}
        for name, ok in zip(active, alive, strict=True):
            failures = 0 if ok else self._health_failures.get(name, 0) + 1
            self._health_failures[name] = failures
            if failures >= self._sched.health_failures:
                gone[name] = "worker not answering"
        idle: list[str] = []
        for name, inst in state.instances.items():
            if name in gone or inst.deactivated:
                continue  # a deactivated instance is being deleted already
            if inst.active:
                self._seen_inactive.pop(name, None)
            else:
                first = self._seen_inactive.setdefault(name, now)
                if now - first >= self._sched.activation_s:
                    gone[name] = "not activated in time"
                continue
            if inst.used_mcpu == 0:
                if now - self._idle_since.setdefault(name, now) >= self._sched.idle_s:
                    idle.append(name)
            else:
                self._idle_since.pop(name, None)
        lost = await self._lose(gone)
        retired = await self._retire(idle)
        scaled = await self._autoscale()
        return lost or retired or scaled

    async def _alive(self, name: str) -> bool:
        address = self._view.addresses.get(name)
        return address is not None and await self._client.alive(address)

    async def _lose(self, gone: dict[str, str]) -> bool:
        """Instances that died: their attempts are lost (new attempts follow), then deleted."""
        events: list[AnyEvent] = []
        for name, reason in sorted(gone.items()):
            log.warning("instance %s lost: %s", name, reason)
            events += [AttemptLost(batch_id=b, job_id=j, attempt_id=a, instance_name=name,
                                   reason="instance_lost", end_time_ms=now_ms())
                       for b, j, a in self._state.running_on(name)]
            events.append(InstanceDeleted(instance_name=name, reason=reason))
        await self._emit(events)
        for name in gone:
            self._forget(name)
            self._spawn(self._driver.delete(name))
        return bool(events)

    async def _retire(self, idle: list[str]) -> bool:
        """Idle instances: deactivated first (nothing more is placed there), then deleted."""
        if not idle:
            return False
        await self._emit([InstanceDeactivated(instance_name=n, reason="idle") for n in idle])
        for name in idle:
            self._forget(name)
            self._spawn(self._delete(name, "idle"))
        return True

    async def _delete(self, name: str, reason: str) -> None:
        await self._driver.delete(name)
        await self._emit([InstanceDeleted(instance_name=name, reason=reason)])

    def _forget(self, name: str) -> None:
        for table in (self._idle_since, self._seen_inactive, self._health_failures):
            table.pop(name, None)

    async def _autoscale(self) -> bool:
        wants = plan(self._state, self._pools, window_jobs_per_user=self._window_jobs(),
                     job_private=self._job_private)
        if not wants:
            return False
        requests = [InstanceRequested(
            instance_name=f"{w.inst_coll}-{secrets.token_hex(4)}", inst_coll=w.inst_coll,
            machine_type=w.machine_type, region=w.region, cores_mcpu=w.cores_mcpu,
            preemptible=w.preemptible, for_batch_id=None if w.job is None else w.job[0],
            for_job_id=None if w.job is None else w.job[1]) for w in wants]
        await self._emit(requests)
        for r in requests:
            log.info("requesting instance %s (%s, %d mCPU, %s)", r.instance_name, r.inst_coll,
                     r.cores_mcpu, r.region)
            self._spawn(self._create(r))
        return True

    def _window_jobs(self) -> int:
        """Jobs the scheduler could start per user in the autoscaler's window."""
        per_second = self._sched.max_jobs_per_step / max(self._sched.idle_loop_s, 0.01)
        return max(1, int(per_second * self._sched.window_s))

    async def _create(self, r: InstanceRequested) -> None:
        try:
            await self._driver.create(InstanceSpec(
                name=r.instance_name, inst_coll=r.inst_coll, machine_type=r.machine_type,
                cores_mcpu=r.cores_mcpu, region=r.region, preemptible=r.preemptible))
        except Exception as e:  # a driver failure of any kind: the instance never comes
            log.error("creating instance %s failed: %s", r.instance_name, e)
            await self._emit([InstanceDeleted(instance_name=r.instance_name,
                                              reason=f"create failed: {e}")])
            return
        await self._emit([InstanceCreated(instance_name=r.instance_name, inst_coll=r.inst_coll)])

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
