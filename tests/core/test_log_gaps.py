"""Holes in fetched offsets are waited out, so a consumer never skips a straggling batch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.log_gaps import Admitted, GapGuard


def test_contiguous_records_are_delivered_as_fetched() -> None:
    guard: GapGuard[str] = GapGuard()
    assert guard.admit("p", 5, [5, 6, 7], now=0) == Admitted(3, None, None)
    assert guard.admit("p", None, [9, 10], now=0) == Admitted(2, None, None)


def test_records_past_a_hole_wait_until_it_fills() -> None:
    guard: GapGuard[str] = GapGuard(patience_s=1.0)
    assert guard.admit("p", 5, [5, 6, 10, 11], now=0) == Admitted(2, 7, None)
    assert guard.admit("p", 7, [10, 11], now=0.5) == Admitted(0, 7, None)
    assert guard.admit("p", 7, [7, 8, 9, 10, 11], now=0.6) == Admitted(5, None, None)
    # The hole filled: a new one at the same place is timed afresh.
    assert guard.admit("p", 12, [13], now=5) == Admitted(0, 12, None)


def test_a_hole_that_outlasts_the_patience_is_accepted() -> None:
    guard: GapGuard[str] = GapGuard(patience_s=1.0)
    assert guard.admit("p", 7, [10, 11], now=0) == Admitted(0, 7, None)
    assert guard.admit("p", 7, [10, 11], now=0.99) == Admitted(0, 7, None)
    assert guard.admit("p", 7, [10, 11], now=1.0) == Admitted(2, None, (7, 10))


def test_partitions_and_forgotten_holes_are_timed_apart() -> None:
    guard: GapGuard[str] = GapGuard(patience_s=1.0)
    guard.admit("p", 0, [2], now=0)
    assert guard.admit("q", 0, [2], now=2) == Admitted(0, 0, None)
    guard.forget("p")
    assert guard.admit("p", 0, [2], now=2) == Admitted(0, 0, None)


@st.composite
def appends(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Record batches of one partition, in offset order, and the order they became readable."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=30))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    order = draw(st.permutations(range(len(sizes))))
    batches = [list(range(s, s + n)) for s, n in zip(starts, sizes, strict=True)]
    return [o for b in batches for o in b], [o for i in order for o in batches[i]]


@given(appends(), st.integers(1, 7), st.integers(1, 4))
def test_a_guarded_consumer_delivers_every_offset_once_in_order(
        log: tuple[list[int], list[int]], fetch_max: int, per_step: int) -> None:
    """A broker that serves whatever is readable past the position (as the stand-in does),
    while batches become readable out of order: the guarded consumer still reads 0, 1, 2..."""
    offsets, arrival = log
    guard: GapGuard[str] = GapGuard(patience_s=10**9)  # never gives up on a hole here
    readable: set[int] = set()
    position, delivered, step = 0, [], 0
    while len(delivered) < len(offsets):
        readable |= set(arrival[:per_step * (step + 1)])
        step += 1
        fetched = [o for o in offsets if o >= position and o in readable][:fetch_max]
        admitted = guard.admit("p", position, fetched, now=step)
        delivered += fetched[:admitted.count]
        position = admitted.seek_to if admitted.seek_to is not None else (
            fetched[admitted.count - 1] + 1 if admitted.count else position)
        assert admitted.accepted is None
        assert step <= 10 * len(offsets) + 10, "no progress"
    assert delivered == offsets


@given(st.lists(st.integers(0, 3), min_size=1, max_size=20), st.floats(0.5, 5))
def test_only_a_hole_older_than_the_patience_is_accepted(holes: list[int],
                                                         patience: float) -> None:
    """Offsets that never become readable: each hole is skipped once it is ``patience`` old."""
    guard: GapGuard[str] = GapGuard(patience_s=patience)
    offsets, next_offset = [], 0
    for hole in holes:
        next_offset += hole
        offsets.append(next_offset)
        next_offset += 1
    position, now, first_seen = 0, 0.0, {}
    while position <= offsets[-1]:
        fetched = [o for o in offsets if o >= position]
        admitted = guard.admit("p", position, fetched, now=now)
        if admitted.accepted is not None:
            start, end = admitted.accepted
            assert now - first_seen[start] >= patience
            assert start == position and end == fetched[0] and end > start
        if admitted.seek_to is not None:
            first_seen.setdefault(admitted.seek_to, now)
        position = admitted.seek_to if admitted.seek_to is not None else fetched[
            admitted.count - 1] + 1
        now += 0.25
