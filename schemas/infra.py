"""Scheduler and instance events: elections (epochs), the instance lifecycle, log markers.

Instance events are keyed by instance name; elections by the constant ``scheduler`` so every
election is totally ordered. The envelope's ``producer_epoch`` of scheduler-produced events is the
epoch of the election that empowered the producer: events from a stale epoch are ignored.
"""

from __future__ import annotations

from typing import ClassVar

from schemas import topics
from schemas.base import Event


class SchedulerEvent(Event, frozen=True, kw_only=True):
    """An event on the scheduler topic."""

    topic: ClassVar[str] = topics.SCHEDULER


class SchedulerElected(SchedulerEvent, frozen=True, kw_only=True, tag="scheduler.elected"):
    """``scheduler_id`` is the active scheduler from ``epoch`` on; earlier epochs are fenced."""

    epoch: int
    scheduler_id: str

    def key(self) -> str:
        """All elections share one key, so they are totally ordered."""
        return "scheduler"


class InstanceEvent(SchedulerEvent, frozen=True, kw_only=True):
    """An event about one instance (a VM, or a local worker process), keyed by its name."""

    instance_name: str

    def key(self) -> str:
        """The instance name."""
        return self.instance_name


class InstanceRequested(InstanceEvent, frozen=True, kw_only=True, tag="instance.requested"):
    """The autoscaler asked the driver for an instance."""

    inst_coll: str
    machine_type: str
    region: str
    cores_mcpu: int
    preemptible: bool
    for_batch_id: int | None = None
    for_job_id: int | None = None


class InstanceCreated(InstanceEvent, frozen=True, kw_only=True, tag="instance.created"):
    """The driver created the instance; it is not yet serving."""

    inst_coll: str


class InstanceActivated(InstanceEvent, frozen=True, kw_only=True, tag="instance.activated"):
    """The worker on the instance activated and accepts jobs at ``address``."""

    address: str
    cores_mcpu: int


class InstanceDeactivated(InstanceEvent, frozen=True, kw_only=True, tag="instance.deactivated"):
    """The instance takes no new jobs (idle, preempted, lost, or told to)."""

    reason: str


class InstanceDeleted(InstanceEvent, frozen=True, kw_only=True, tag="instance.deleted"):
    """The driver deleted the instance."""

    reason: str


class LogMarker(Event, frozen=True, kw_only=True, tag="log.marker"):
    """A marker a consumer writes to a partition and reads back to know it has caught up.

    ``end_offsets()`` is not trustworthy on every broker; reading one's own marker is.
    """

    topic: ClassVar[str] = topics.SCHEDULER
    marker_id: str
    kafka_partition: int

    def key(self) -> str:
        """The marker id (the producer picks the partition explicitly)."""
        return self.marker_id
