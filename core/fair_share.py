"""Hail's water-filling fair share of free cores across users, and the autoscaler's look-ahead.

Fair share (seed ``hail-batch-design.rst``, "Fair Share"): start with the user who has the fewest
cores running and give them free cores until they reach the running cores of the next user; then
split what is left equally between the two until they reach the next user; repeat until the free
cores are exhausted or every user's ready cores are satisfied. Seen as water filling: each user
is a column whose floor is its running cores and whose ceiling is running + ready; one water
level ``L`` is raised until the free cores are used up, and each user gets
``clamp(L - running, 0, ready)``.

All quantities are integer mCPU. The level is found exactly by sweeping the sorted floors and
ceilings (O(n log n)); when the free cores do not divide evenly at the final level, the last
``r < k`` mCPU go one each to the users still filling at that level, fewest running cores first
and then by user name, so the result never depends on the order of the input and the sum is
exactly ``min(free, total ready)``.

Autoscaler look-ahead (same seed, "Autoscaler", steps 1-4), see :func:`autoscaler_shares` and
:func:`estimated_job_queue`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

AUTOSCALER_SHARE_TOTAL: Final = 300
"""The seed's "share for each user out of 300" (scheduling opportunities per user)."""

AUTOSCALER_WINDOW_SECS: Final = 150
"""The seed's 2.5-minute autoscaler window (about the time a new instance takes to start)."""


class Demand(Protocol):
    """What fair share needs to know about one user (in one instance collection)."""

    @property
    def ready_mcpu(self) -> int:
        """Cores of the user's ready (schedulable, not cancelled) jobs, in mCPU."""
        ...

    @property
    def running_mcpu(self) -> int:
        """Cores of the user's running (and creating) jobs, in mCPU."""
        ...


@dataclass(frozen=True, slots=True)
class UserDemand:
    """A plain :class:`Demand`."""

    ready_mcpu: int
    running_mcpu: int = 0


def fair_share(free_mcpu: int, demands: Mapping[str, Demand]) -> dict[str, int]:
    """Split ``free_mcpu`` across users by water filling from the fewest running cores.

    Args:
        free_mcpu: Free cores of the healthy instances, in mCPU; zero or less allocates nothing.
        demands: Each user's ready and running cores, in mCPU (both must be non-negative).

    Returns:
        The mCPU allocated to every user in ``demands`` (0 when they get nothing). Each
        allocation is at most the user's ready cores, and the total is exactly
        ``min(max(free_mcpu, 0), total ready)``.

    Raises:
        ValueError: A demand has negative ready or running cores.

    """
    for user, d in demands.items():
        if d.ready_mcpu < 0 or d.running_mcpu < 0:
            raise ValueError(f"negative demand for user {user!r}")
    result = dict.fromkeys(demands, 0)
    wanting = {u: d for u, d in demands.items() if d.ready_mcpu > 0}
    if free_mcpu <= 0 or not wanting:
        return result
    if sum(d.ready_mcpu for d in wanting.values()) <= free_mcpu:
        return {u: d.ready_mcpu for u, d in demands.items()}

    level, remainder = _water_level(free_mcpu, wanting)
    # Users still filling at the final level each take one of the ``remainder`` extra mCPU.
    filling = sorted(
        (u for u, d in wanting.items() if d.running_mcpu <= level < d.running_mcpu + d.ready_mcpu),
        key=lambda u: (wanting[u].running_mcpu, u),
    )
    extra = set(filling[:remainder])
    for u, d in wanting.items():
        base = min(max(level - d.running_mcpu, 0), d.ready_mcpu)
        result[u] = base + (1 if u in extra else 0)
    return result


def _water_level(free_mcpu: int, wanting: Mapping[str, Demand]) -> tuple[int, int]:
    """The integer level ``L`` and the leftover ``r`` once every column is filled to ``L``.

    Precondition: the total ready cores exceed ``free_mcpu`` (so the sweep stops inside).
    """
    # Slope changes: +1 where a user's floor (running) is reached, -1 at its ceiling.
    steps: dict[int, int] = {}
    for d in wanting.values():
        steps[d.running_mcpu] = steps.get(d.running_mcpu, 0) + 1
        top = d.running_mcpu + d.ready_mcpu
        steps[top] = steps.get(top, 0) - 1
    points = sorted(steps)
    level, slope, left = points[0], 0, free_mcpu
    for point in points:
        cost = slope * (point - level)
        if slope > 0 and cost > left:
            return level + left // slope, left % slope
        left -= cost
        level = point
        slope += steps[point]
    raise AssertionError("total ready cores do not exceed the free cores")  # pragma: no cover


def autoscaler_shares(
    allocations: Mapping[str, int], total: int = AUTOSCALER_SHARE_TOTAL
) -> dict[str, int]:
    """Each user's share of ``total`` scheduling opportunities (autoscaler step 1).

    ``share = round_half_up(total * allocation / sum of allocations)``, at least 1 for any user
    with a positive allocation so that nobody with an allocation drops out of the look-ahead.
    Users with no allocation are left out.

    Args:
        allocations: The output of :func:`fair_share` (mCPU per user).
        total: The number of opportunities to share out (the seed's 300).

    Returns:
        Share per user with a positive allocation.

    """
    positive = {u: a for u, a in allocations.items() if a > 0}
    whole = sum(positive.values())
    return {u: max(1, (2 * total * a + whole) // (2 * whole)) for u, a in positive.items()}


class QueuedJob(Protocol):
    """A ready job as the autoscaler's look-ahead sees it."""

    @property
    def cores_mcpu(self) -> int:
        """The job's cores, in mCPU."""
        ...

    @property
    def regions(self) -> Collection[str]:
        """Regions the job may run in; empty means any."""
        ...


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One job of the estimated queue: whose, in which scheduler iteration, where."""

    user: str
    iteration: int
    cores_mcpu: int
    regions: frozenset[str]


def estimated_job_queue(
    shares: Mapping[str, int],
    heads: Mapping[str, Sequence[QueuedJob]],
    window_secs: int = AUTOSCALER_WINDOW_SECS,
) -> list[WindowEntry]:
    """The jobs the scheduler is expected to run within the window, in expected order.

    Autoscaler steps 2-4 of the seed: for each user take the first ``N = share * window_secs``
    ready jobs of their queue (the window read in seconds makes ``N`` a job count); job ``i``
    of a user (from 0) is expected in scheduler iteration ``i // share``; the union is sorted
    by iteration, then by share (larger first), user name and regions.

    Args:
        shares: The output of :func:`autoscaler_shares`; users without a share are skipped.
        heads: Each user's ready jobs in the order the scheduler will take them (the head of
            the queue is enough: at most ``N`` jobs are read).
        window_secs: The look-ahead window (the seed's 2.5 minutes).

    Returns:
        The estimated queue.

    """
    entries: list[WindowEntry] = []
    for user, share in shares.items():
        if share <= 0:
            continue
        for i, job in enumerate(heads.get(user, ())[: share * window_secs]):
            entries.append(WindowEntry(user, i // share, job.cores_mcpu, frozenset(job.regions)))
    entries.sort(key=lambda e: (e.iteration, -shares[e.user], e.user, sorted(e.regions)))
    return entries


def window_cores_by_regions(entries: Sequence[WindowEntry]) -> dict[frozenset[str], int]:
    """Sum the cores of the estimated queue per region set, in order of first appearance.

    Args:
        entries: The output of :func:`estimated_job_queue`.

    Returns:
        mCPU to provision per set of allowed regions (the empty set means any region).

    """
    cores: dict[frozenset[str], int] = {}
    for e in entries:
        cores[e.regions] = cores.get(e.regions, 0) + e.cores_mcpu
    return cores


def window_cores_by_user(entries: Sequence[WindowEntry]) -> dict[str, int]:
    """Sum the cores of the estimated queue per user (the cores to request for each user).

    Args:
        entries: The output of :func:`estimated_job_queue`.

    Returns:
        mCPU per user within the window.

    """
    cores: dict[str, int] = {}
    for e in entries:
        cores[e.user] = cores.get(e.user, 0) + e.cores_mcpu
    return cores
