"""Which ids of a fixed range have been seen: disjoint sorted runs, so that re-sent ids count once.

Ingest keeps one per open update to know, without the projection, that every job of the
update was durably appended (the official client sends consecutive ids, so a whole update is
usually one run).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable


class IdTally:
    """The distinct ids seen within ``[lo, lo + n)``; ids outside it are ignored."""

    __slots__ = ("_ends", "_starts", "count", "lo", "n")

    def __init__(self, lo: int, n: int) -> None:
        self.lo = lo
        self.n = n
        self.count = 0
        # Disjoint, non-touching half-open runs [start, end), sorted.
        self._starts: list[int] = []
        self._ends: list[int] = []

    @property
    def complete(self) -> bool:
        """Whether every id of the range has been seen."""
        return self.count == self.n

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The half-open runs of seen ids, in order."""
        return list(zip(self._starts, self._ends, strict=True))

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, int):
            return False
        k = bisect_right(self._starts, i) - 1
        return k >= 0 and i < self._ends[k]

    def seen_within(self, lo: int, hi: int) -> int:
        """How many ids of ``[lo, hi)`` have been seen (none in an empty range, ``hi <= lo``)."""
        if hi <= lo:  # a run across lo would otherwise count hi - lo, a negative
            return 0
        starts, ends = self._starts, self._ends
        n = 0
        for k in range(max(bisect_right(ends, lo), 0), len(starts)):
            if starts[k] >= hi:
                break
            n += min(ends[k], hi) - max(starts[k], lo)
        return n

    def add(self, ids: Iterable[int]) -> None:
        """Count ``ids`` (any order; repeats and ids seen before count once)."""
        start = end = None
        for i in ids:
            if end is not None and i == end:
                end += 1
                continue
            if start is not None and end is not None:
                self.add_run(start, end)
            start, end = i, i + 1
        if start is not None and end is not None:
            self.add_run(start, end)

    def add_run(self, start: int, end: int) -> None:
        """Count the ids of ``[start, end)``."""
        start, end = max(start, self.lo), min(end, self.lo + self.n)
        if start >= end:
            return
        starts, ends = self._starts, self._ends
        i = bisect_left(ends, start)  # first run ending at or after start: touches or follows
        j = bisect_right(starts, end)  # runs before j start at or before end
        covered = 0
        if i < j:
            covered = sum(ends[k] - starts[k] for k in range(i, j))
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]
        self.count += (end - start) - covered
