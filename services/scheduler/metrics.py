"""The scheduler's metrics.

Counters are incremented by the leader's rounds, by the size of what a round published (one
increment per round and kind, never per job). Gauges of the in-memory state (ready and running
cores per user and pool, instances, leadership) are read at scrape time by
:class:`StateCollector` from the replica's :class:`~services.scheduler.view.View`: nothing is
pushed on the hot path, and a scrape costs O(users x pools + instances).
"""

from __future__ import annotations

from collections import Counter as TypeCounter
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from schemas.batch import BatchCancelled, JobGroupCancelled
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptLost,
    JobCancelled,
    JobsCancelled,
    JobScheduled,
    JobsScheduled,
    JobUnschedulable,
)
from schemas.infra import InstanceRequested
from services.common.metrics import REGISTRY, counter, histogram
from services.scheduler.view import View

SJ_PUBLISHED = counter("hs_scheduler_sj_published",
                       "Jobs scheduled (SJ events published by the leader).")
UNSCHEDULABLE = counter("hs_scheduler_unschedulable",
                        "Jobs found unschedulable (no pool or machine can ever fit them).")
CANCELLATIONS = counter(
    "hs_scheduler_cancellations",
    "Cancellation work by kind: job (a cancelled Ready job ended), kill (a kill sent to a "
    "worker), group_failures (a group cancelled after n failures), billing_limit (a batch "
    "cancelled because its billing project reached its limit).", ["kind"])
ATTEMPTS_LOST = counter("hs_scheduler_attempts_lost",
                        "Attempts the leader declared lost, by reason.", ["reason"])
INSTANCES_REQUESTED = counter("hs_scheduler_instances_requested",
                              "Instances the autoscaler requested.")
ROUND_SECONDS = histogram("hs_scheduler_round_seconds",
                          "Time one leader round took (its _count: rounds run).")

_cancel_kinds: dict[str, Counter] = {}
_lost_reasons: dict[str, Counter] = {}


_KINDS: dict[type, str] = {JobCancelled: "job", JobGroupCancelled: "group_failures",
                           BatchCancelled: "billing_limit"}


def published(events: Sequence[AnyEvent]) -> None:
    """Count what the leader published: O(events) in C, then one increment per event type."""
    by_type = TypeCounter(map(type, events))
    for kind, n in by_type.items():
        if kind is JobScheduled:
            SJ_PUBLISHED.inc(n)
        elif kind is JobsScheduled:
            SJ_PUBLISHED.inc(sum(len(e.attempts) for e in events
                                 if isinstance(e, JobsScheduled)))
        elif kind is JobUnschedulable:
            UNSCHEDULABLE.inc(n)
        elif kind is InstanceRequested:
            INSTANCES_REQUESTED.inc(n)
        elif kind is AttemptLost:
            for reason, m in TypeCounter(e.reason for e in events
                                         if isinstance(e, AttemptLost)).items():
                lost(reason, m)
        elif kind is JobsCancelled:
            cancelled("job", sum(len(e.job_ids) for e in events
                                 if isinstance(e, JobsCancelled)))
        elif kind in _KINDS:
            cancelled(_KINDS[kind], n)


def cancelled(kind: str, n: int) -> None:
    """``n`` cancellations of ``kind`` (see :data:`CANCELLATIONS`)."""
    if n:
        child = _cancel_kinds.get(kind)
        if child is None:
            child = _cancel_kinds[kind] = CANCELLATIONS.labels(kind)
        child.inc(n)


def lost(reason: str, n: int) -> None:
    """``n`` attempts lost for ``reason``."""
    if n:
        child = _lost_reasons.get(reason)
        if child is None:
            child = _lost_reasons[reason] = ATTEMPTS_LOST.labels(reason)
        child.inc(n)


class Replica(Protocol):
    """What the collector reads of a scheduler replica."""

    view: View
    epoch: int | None


class StateCollector(Collector):
    """Gauges of one replica's in-memory state, read at scrape time (empty until watched;
    a standby reports only ``hs_scheduler_leader`` and ``hs_scheduler_epoch``)."""

    def __init__(self) -> None:
        self._replica: Replica | None = None
        self._scheduler_id = ""

    def watch(self, replica: Replica, scheduler_id: str) -> None:
        """Report ``replica`` from now on."""
        self._replica, self._scheduler_id = replica, scheduler_id

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        replica = self._replica
        if replica is None:
            yield from families
            return
        ready, running, instances, cores, leader, epoch, batches = families
        state = replica.view.state
        leader.add_metric([self._scheduler_id], 1 if replica.epoch is not None else 0)
        epoch.add_metric([self._scheduler_id], state.epoch)
        if replica.epoch is None:
            # A standby folds the same log: only the leader reports the state, so sums over
            # replicas count it once.
            yield from families
            return
        for (user, inst_coll), mcpu in state.ready_mcpu.items():
            ready.add_metric([user, inst_coll], mcpu)
        for (user, inst_coll), mcpu in state.running_mcpu.items():
            running.add_metric([user, inst_coll], mcpu)
        counts: dict[tuple[str, str], int] = defaultdict(int)
        capacity: dict[tuple[str, str], int] = defaultdict(int)
        for inst in state.instances.values():
            kind = ("deactivated" if inst.deactivated else "active" if inst.active
                    else "creating")
            counts[(inst.inst_coll, kind)] += 1
            if kind == "active":
                capacity[(inst.inst_coll, "total")] += inst.total_mcpu
                capacity[(inst.inst_coll, "free")] += inst.free_mcpu
        for labels, n in counts.items():
            instances.add_metric(list(labels), n)
        for labels, mcpu in capacity.items():
            cores.add_metric(list(labels), mcpu)
        batches.add_metric([], len(state.batches))
        yield from families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("hs_scheduler_ready_cores_mcpu",
                              "Cores (mCPU) of Ready, not cancelled jobs, per user and pool.",
                              labels=["user", "inst_coll"]),
            GaugeMetricFamily("hs_scheduler_running_cores_mcpu",
                              "Cores (mCPU) of Running, not cancelled jobs, per user and pool.",
                              labels=["user", "inst_coll"]),
            GaugeMetricFamily("hs_scheduler_instances",
                              "Instances per pool and state (creating, active, deactivated).",
                              labels=["inst_coll", "state"]),
            GaugeMetricFamily("hs_scheduler_instance_cores_mcpu",
                              "Cores (mCPU) of active instances per pool: total and free.",
                              labels=["inst_coll", "kind"]),
            GaugeMetricFamily("hs_scheduler_leader",
                              "1 while this replica leads, 0 while it stands by.",
                              labels=["scheduler_id"]),
            GaugeMetricFamily("hs_scheduler_epoch",
                              "The latest election epoch this replica has folded (its own "
                              "while it leads).", labels=["scheduler_id"]),
            GaugeMetricFamily("hs_scheduler_batches",
                              "Batches with unfinished jobs in the scheduler's memory."),
        ]


STATE = StateCollector()
REGISTRY.register(STATE)
