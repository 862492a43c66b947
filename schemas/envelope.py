"""The envelope every event travels in.

The envelope carries what consumers need without looking inside the event: a unique event id
(for idempotence), the tag and its schema version (for upcasting), the time it was appended, the
partition key, and the producer's epoch (for fencing a deposed scheduler; 0 for producers that
are not fenced).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from schemas.base import Event
from schemas.batch import JobHeadsSubmitted, JobsSubmitted
from schemas.events import EVENT_TYPES, AnyEvent, tag_of
from schemas.execution import RAW_VIEWS, RawJobCompleted, RawJobScheduled, RawJobStarted


class Envelope(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """An event with its metadata. Construct it with :func:`wrap`."""

    event_id: str
    tag: str
    schema_version: int
    time_ms: int
    key: str
    producer_epoch: int = 0
    event: AnyEvent

    def __post_init__(self) -> None:
        """Reject an envelope whose header contradicts its event.

        It runs for every envelope every consumer decodes: the event's tag is looked up by its
        class (reading ``__struct_config__`` builds an object each time: a fifth of a decode).
        """
        event = self.event
        tag = _TAGS.get(type(event)) or tag_of(type(event))
        if self.tag != tag:
            raise ValueError(f"envelope tag {self.tag!r} does not match event tag {tag!r}")
        if self.key != event.key():
            raise ValueError(
                f"envelope key {self.key!r} does not match the event's key {self.event.key()!r}"
            )

    @property
    def topic(self) -> str:
        """The logical topic of the event."""
        return self.event.topic


_VIEWED: tuple[type[Event], ...] = (*EVENT_TYPES, JobHeadsSubmitted, *RAW_VIEWS.values())
_TAGS: dict[type, str] = {cls: tag_of(cls) for cls in _VIEWED}
"""Each event class's tag (what :func:`~schemas.events.tag_of` reads from the class)."""

_HeadsEvent = Union[tuple(  # type: ignore[valid-type]  # noqa: UP007
    JobHeadsSubmitted if t is JobsSubmitted else t for t in EVENT_TYPES)]


class HeadsEnvelope(Envelope, frozen=True, kw_only=True, gc=False):
    """An envelope as the projector and the scheduler decode it.

    A bunch of jobs is a :class:`JobHeadsSubmitted` (no specs); every other event is as in
    :class:`Envelope`.
    """

    event: _HeadsEvent  # type: ignore[valid-type]


_BulkEvent = Union[tuple(  # type: ignore[valid-type]  # noqa: UP007
    JobHeadsSubmitted if t is JobsSubmitted else RAW_VIEWS.get(t, t) for t in EVENT_TYPES)]


class BulkEnvelope(HeadsEnvelope, frozen=True, kw_only=True, gc=False):
    """An envelope as the rebuild's bulk lanes decode it (msgpack only).

    As :class:`HeadsEnvelope`, and SJ, MJS and MJC come as their views with the resources
    undecoded (:data:`schemas.execution.RAW_VIEWS`); :func:`full` makes them events again.
    """

    event: _BulkEvent  # type: ignore[valid-type]


def full(envelope: Envelope) -> Envelope:
    """``envelope`` with an event view of :class:`BulkEnvelope` made the event itself.

    That is a :class:`HeadsEnvelope`; any other envelope is returned as it is.

    Raises:
        msgspec.DecodeError: The view's resources are not a resource list.

    """
    event: Any = envelope.event
    if isinstance(event, RawJobScheduled | RawJobStarted | RawJobCompleted):
        return HeadsEnvelope(event_id=envelope.event_id, tag=envelope.tag,
                             schema_version=envelope.schema_version, time_ms=envelope.time_ms,
                             key=envelope.key, producer_epoch=envelope.producer_epoch,
                             event=event.full())
    return envelope


def wrap(event: AnyEvent, *, event_id: str, time_ms: int, producer_epoch: int = 0) -> Envelope:
    """Put ``event`` in an envelope. The id and clock are injected, so this stays pure.

    Args:
        event: the event.
        event_id: a globally unique id (a UUID in hex, say).
        time_ms: milliseconds since the Unix epoch at which the event is appended.
        producer_epoch: the fencing epoch of the producer, 0 if it is not fenced.

    Returns:
        The envelope, keyed by the event's partition key.

    """
    return Envelope(
        event_id=event_id,
        tag=tag_of(type(event)),
        schema_version=type(event).version,
        time_ms=time_ms,
        key=event.key(),
        producer_epoch=producer_epoch,
        event=event,
    )
