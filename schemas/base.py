"""The base of every event and the value types events share.

Every event is a frozen msgspec struct with an explicit, stable string tag (never a class path),
encoded under the ``type`` field. Each event names its topic and its partition key, so a producer
never has to know where an event goes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from schemas import topics

JobState = Literal[
    "Pending", "Ready", "Creating", "Running", "Success", "Failed", "Error", "Cancelled"
]
"""A job's state, spelled as the Hail API spells it."""

CompletedJobState = Literal["Success", "Failed", "Error", "Cancelled"]
"""The states a job never leaves."""

BatchOutcome = Literal["success", "failure", "cancelled"]
"""How a complete batch or job group ended (the API's ``state`` of a complete batch)."""

CancelReason = Literal["user", "billing_limit", "n_failures", "parent_failed", "deleted"]
"""Why something was cancelled."""

InstanceLossReason = Literal["preempted", "instance_lost", "delivery_failed", "deactivated"]
"""Why an attempt ended without the worker reporting completion."""


# gc=False on every event and record struct: they are frozen trees of values and can never be
# part of a reference cycle, so the cyclic collector need not track them. A decoded bunch of
# 1,024 jobs was ~4,000 tracked objects, and the collections they set off were half of the
# projector's decoding time (measured with py-spy --native); untracked, one list per job is left.
class Event(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True, gc=False
):
    """Base of every event: a fact or a request, recorded on the log.

    Subclasses set ``tag=`` (stable forever), ``topic`` and implement :meth:`key`.
    ``version`` is the current schema version of the tag; older versions are upcast on decode.
    """

    topic: ClassVar[str]
    version: ClassVar[int] = 1

    def key(self) -> str:
        """The partition key: events with the same key are totally ordered."""
        raise NotImplementedError


class BatchEvent(Event, frozen=True, kw_only=True):
    """An event about one batch. Keyed by the batch id, so a batch has exactly one writer."""

    topic: ClassVar[str] = topics.BATCH
    batch_id: int

    def key(self) -> str:
        """The batch id as text."""
        return str(self.batch_id)


class AttemptResource(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One billed resource of an attempt: ``quantity`` of ``resource`` per millisecond.

    Units follow the reference: compute and service fee in mCPU, memory in MiB, disk and IP fee
    in 1/1024 of a worker. Usage is ``quantity * duration_ms``.
    """

    resource: str
    quantity: int


class JobResources(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """What a job asks of an instance, normalised from its spec at submission."""

    cores_mcpu: int
    memory_bytes: int
    storage_gib: int = 0
    machine_type: str | None = None
    preemptible: bool = True
    regions: list[str] | None = None
