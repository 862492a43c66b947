"""A compact, ordered set of jobs: the scheduler's ready and cancel queues."""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class JobQueue:
    """A set of (batch id, job id) iterated in that order: one byte per job id per batch.

    Adding and removing are O(1) (amortised); iteration skips absent jobs at C speed
    (``bytearray.find``). A batch's array is dropped when its last job leaves.
    """

    __slots__ = ("_batches", "_bits", "_counts", "_n")

    def __init__(self) -> None:
        """An empty queue."""
        self._bits: dict[int, bytearray] = {}
        self._counts: dict[int, int] = {}
        self._batches: list[int] = []
        self._n = 0

    def add(self, batch_id: int, job_id: int) -> None:
        """Add a job (no-op if present)."""
        bits = self._bits.get(batch_id)
        if bits is None:
            bits = self._bits[batch_id] = bytearray()
            self._counts[batch_id] = 0
            bisect.insort(self._batches, batch_id)
        if job_id >= len(bits):
            bits.extend(bytes(max(job_id + 1, 2 * len(bits)) - len(bits)))
        if not bits[job_id]:
            bits[job_id] = 1
            self._counts[batch_id] += 1
            self._n += 1

    def add_run(self, batch_id: int, first: int, n: int) -> None:
        """Add jobs ``first`` to ``first + n - 1`` (no-op for those present).

        A committed bunch at once, in C calls, not a call per job.
        """
        if n <= 0:
            return
        bits = self._bits.get(batch_id)
        if bits is None:
            bits = self._bits[batch_id] = bytearray()
            self._counts[batch_id] = 0
            bisect.insort(self._batches, batch_id)
        end = first + n
        if end > len(bits):
            bits.extend(bytes(max(end, 2 * len(bits)) - len(bits)))
        new = bits.count(0, first, end)
        bits[first:end] = b"\x01" * n
        self._counts[batch_id] += new
        self._n += new

    def discard(self, batch_id: int, job_id: int) -> None:
        """Remove a job (no-op if absent)."""
        bits = self._bits.get(batch_id)
        if bits is None or job_id >= len(bits) or not bits[job_id]:
            return
        bits[job_id] = 0
        self._n -= 1
        self._counts[batch_id] -= 1
        if not self._counts[batch_id]:
            del self._bits[batch_id], self._counts[batch_id]
            self._batches.remove(batch_id)

    def __contains__(self, item: object) -> bool:
        """Whether ``(batch_id, job_id)`` is queued."""
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        bits = self._bits.get(item[0])
        return bits is not None and 0 <= item[1] < len(bits) and bits[item[1]] == 1

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The queued jobs in (batch id, job id) order (do not mutate while iterating)."""
        for batch_id in self._batches:
            bits = self._bits[batch_id]
            i = bits.find(1)
            while i >= 0:
                yield batch_id, i
                i = bits.find(1, i + 1)

    def __len__(self) -> int:
        """The number of queued jobs."""
        return self._n

    def __eq__(self, other: object) -> bool:
        """Queues are equal when they hold the same jobs."""
        return isinstance(other, JobQueue) and len(self) == len(other) and list(self) == list(
            other)

    __hash__ = None  # type: ignore[assignment]
