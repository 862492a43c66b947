"""How the API presents batches, job groups and times (pure).

The state of a batch, in the order the reference checks it: ``open`` until the first commit;
``failure`` as soon as any job failed (even while others run); ``cancelled``; ``success`` only
when complete; else ``running``. Job groups use the same order without ``open``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

_UNITS_MS: tuple[tuple[int, str], ...] = (
    (30 * 86_400_000, "month"),
    (7 * 86_400_000, "week"),
    (86_400_000, "day"),
    (3_600_000, "hour"),
    (60_000, "minute"),
    (1_000, "s"),
    (1, "ms"),
)
_SHORT = {"s", "ms"}


def format_time_ms(ms: int | None) -> str | None:
    """``2026-01-01T00:00:00.000Z`` for milliseconds since the epoch; None stays None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
        f"{ms % 1000:03d}Z")


def _unit(n: int, name: str) -> str:
    if name in _SHORT:
        return f"{n}{name}"
    return f"{n} {name}" if n == 1 else f"{n} {name}s"


def humanize_ms(ms: int | None) -> str | None:
    """A duration as a major and a minor unit, e.g. ``1 minute 5s``, ``2s 30ms``, ``0ms``."""
    if ms is None:
        return None
    for (major, major_name), (minor, minor_name) in pairwise(_UNITS_MS):
        if ms >= major:
            hi, lo = ms // major, (ms % major) // minor
            return _unit(hi, major_name) + (f" {_unit(lo, minor_name)}" if lo else "")
    return _unit(ms, "ms")


def duration_ms(start_ms: int | None, end_ms: int | None, now_ms: int) -> int | None:
    """Elapsed time from ``start_ms`` to ``end_ms``, or to now while still running."""
    if start_ms is None:
        return None
    return max(0, (end_ms if end_ms is not None else now_ms) - start_ms)


def group_state(*, n_failed: int, cancelled: bool, complete: bool) -> str:
    """A job group's API state."""
    if n_failed > 0:
        return "failure"
    if cancelled:
        return "cancelled"
    if complete:
        return "success"
    return "running"


def batch_state(*, committed: bool, n_failed: int, cancelled: bool, complete: bool) -> str:
    """A batch's API state (``open`` before its first commit)."""
    if not committed:
        return "open"
    return group_state(n_failed=n_failed, cancelled=cancelled, complete=complete)
