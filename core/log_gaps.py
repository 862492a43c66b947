"""Holding back records fetched past a hole in a partition's offsets, until the hole fills.

Kafka assigns a partition's offsets in order and a fetch never returns a record past one that is
not readable yet, so a consumer sees every offset. The local stand-in broker (tansu) does not
promise that: with several producers appending to one partition at once, a fetch can return a
later record batch before an earlier one is readable (seen: offsets 4,460-4,469 skipped by a
consumer reading while six producers appended; and a live projector that never applied fourteen
MJCs). A consumer that took such a fetch as it came would skip the earlier records for good.

:func:`admit` decides, for the records one fetch returned for one partition, how many to
deliver: those up to the first hole. The caller seeks back to the hole's first offset and
fetches again. A hole that outlasts ``patience_s`` is accepted (offsets that will never be read:
a compacted topic, transaction markers), so a consumer never stalls for good; the caller logs it.
Pure: the caller passes the clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

PATIENCE_S: Final = 1.0
"""How long a hole is waited out before it is accepted: long against the milliseconds a
straggling batch of the stand-in broker takes, short against a consumer's staleness budget."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """What to do with one partition's fetched records."""

    count: int
    """How many of them (from the first) to deliver."""
    seek_to: int | None
    """The offset to fetch again from (the hole's first), or None."""
    accepted: tuple[int, int] | None
    """A hole ``[start, end)`` given up on: its offsets are skipped."""


@dataclass(slots=True)
class GapGuard(Generic[K]):
    """Per partition, since when a hole has been seen (to tell a straggler from a real gap)."""

    patience_s: float = PATIENCE_S
    _holes: dict[K, tuple[int, float]] = field(default_factory=dict)

    def forget(self, key: K) -> None:
        """The partition was sought or reassigned: a hole seen before no longer counts."""
        self._holes.pop(key, None)

    def admit(self, key: K, expected: int | None, offsets: Sequence[int],
              now: float) -> Admitted:
        """Decide on the records one fetch returned for partition ``key``.

        Args:
            key: The partition.
            expected: The next offset the consumer should read (None: unknown, so the first
                record is taken as it comes).
            offsets: The fetched records' offsets, in the order fetched (increasing).
            now: The clock, in seconds.

        Returns:
            How many records to deliver, where to seek back to, and any hole accepted.

        """
        accepted: tuple[int, int] | None = None
        for i, offset in enumerate(offsets):
            if expected is not None and offset > expected:
                first_seen = self._holes.get(key)
                if first_seen is None or first_seen[0] != expected:
                    self._holes[key] = (expected, now)
                    return Admitted(i, expected, accepted)
                if now - first_seen[1] < self.patience_s:
                    return Admitted(i, expected, accepted)
                del self._holes[key]
                accepted = accepted or (expected, offset)
            elif expected is not None and offset == expected:
                self._holes.pop(key, None)
            expected = offset + 1
        return Admitted(len(offsets), None, accepted)
