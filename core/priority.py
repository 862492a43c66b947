"""JAliEn-style user priority and quotas (pure).

The formula is the "novel user scheduling algorithm" of the JAliEn thesis (seed
``jalien-fair-priority-and-db-locking-thesis.md``, section 3.4.2, Listings 3.3 and 3.4,
Tables 3.4 and 3.5), with cores counted in mCPU:

- **Quota** (3.4.2, ``isQuotaExceeded``): a user is blocked, with computed priority -1, when
  their active cores are at or above ``max_active_cores_mcpu``, their cost in the last 24 h is
  at or above ``max_cost_24h``, or (if set) their core-time in the last 24 h is at or above
  ``max_core_seconds_24h`` (the thesis's ``maxTotalRunningTime`` quota of 3.4.1).
- **Weighted sum** (Listing 3.4, weights of Table 3.5)::

      w = 0.1 * sqrt(cost_24h / max_cost_24h)
        + 0.5 * active_cores / max_active_cores
        + 0.4 * (1 - baseline / highest baseline of any user)

  Each quotient lies in [0, 1], so ``w`` does too; lower is better for the user.
- **Boost** (Listing 3.3, equations 3.4-3.5): 10 below a cost of 100,000 in the last 24 h,
  0 above 1,000,000, linear in between and rounded half up:
  ``round(10 * (1,000,000 - cost) / (1,000,000 - 100,000))``.
- **Computed priority** = ``boost + (1 - w)``, higher first.

One deliberate deviation: Listing 3.4 returns ``abs(w + boost - 1)``. That equals ``1 - w``
only when the boost is 0; with a boost of 1 or more it becomes ``w + boost - 1``, which *grows*
with usage inside a boost band (a boosted user starting more cores would gain priority). The
text says the value should decrease "in relation to resources spent" and that the boost is
added to the priority, so we add the boost to ``1 - w``. Consequences: unblocked priorities lie
in [0, 11]; more recent use never raises a user's priority; a higher baseline never lowers it.

Cost is in whatever integer unit the billing projections use; the boost thresholds are in the
same unit and are settings (the thesis values are the defaults).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

BLOCKED_PRIORITY: Final = -1.0
"""The computed priority of a user over a quota (the thesis's -1)."""

REASON_ACTIVE_CORES: Final = "quota: max active cores"
REASON_COST: Final = "quota: max 24h cost"
REASON_CORE_TIME: Final = "quota: max 24h core time"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserQuota:
    """A user's configured baseline priority and quotas (the thesis's PRIORITY row)."""

    baseline_priority: int
    """Positive; higher is better (the thesis uses 1 to 20,000)."""
    max_active_cores_mcpu: int
    """Positive; the thesis's ``maxParallelJobs``, counted in cores."""
    max_cost_24h: int
    """Positive; the thesis's ``maxTotalCpuCost``."""
    max_core_seconds_24h: int | None = None
    """Optional quota on core-seconds used in the last 24 h (``maxTotalRunningTime``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UserUsage:
    """What a user has used: cores running now, cost and core-time over the last 24 h."""

    active_cores_mcpu: int = 0
    cost_24h: int = 0
    core_seconds_24h: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PrioritySettings:
    """Weights and boost thresholds (defaults: thesis Table 3.5 and Listing 3.3)."""

    cost_weight: float = 0.1
    active_cores_weight: float = 0.5
    priority_weight: float = 0.4
    max_boost: int = 10
    boost_full_below_cost: int = 100_000
    boost_none_above_cost: int = 1_000_000


DEFAULT_SETTINGS: Final = PrioritySettings()


@dataclass(frozen=True, slots=True)
class UserPriority:
    """A user's computed priority (higher runs first) and the quota blocking them, if any."""

    priority: float
    blocked: str | None = None
    boost: int = 0
    weighted_usage: float = field(default=0.0, compare=False)


def quota_block(quota: UserQuota, usage: UserUsage) -> str | None:
    """The quota a user is at or over, as a reason string, or None when within all quotas.

    Args:
        quota: The user's quotas.
        usage: The user's current usage.

    Returns:
        ``"quota: max active cores"``, ``"quota: max 24h cost"``, ``"quota: max 24h core time"``
        (checked in that order) or None.

    """
    if usage.active_cores_mcpu >= quota.max_active_cores_mcpu:
        return REASON_ACTIVE_CORES
    if usage.cost_24h >= quota.max_cost_24h:
        return REASON_COST
    limit = quota.max_core_seconds_24h
    if limit is not None and usage.core_seconds_24h >= limit:
        return REASON_CORE_TIME
    return None


def boost(cost_24h: int, settings: PrioritySettings = DEFAULT_SETTINGS) -> int:
    """The boost for little recent use (thesis Listing 3.3), rounded half up.

    Args:
        cost_24h: The user's cost in the last 24 h.
        settings: Thresholds and maximum boost.

    Returns:
        ``max_boost`` below ``boost_full_below_cost``, 0 above ``boost_none_above_cost``, and
        ``round(max_boost * (high - cost) / (high - low))`` in between (non-increasing in cost).

    """
    low, high = settings.boost_full_below_cost, settings.boost_none_above_cost
    if cost_24h > high:
        return 0
    if cost_24h < low:
        return settings.max_boost
    span = high - low
    # Exact integer form of Java's Math.round(maxBoost + slope * (cost - minCost)).
    return (2 * settings.max_boost * (high - cost_24h) + span) // (2 * span)


def user_priority(
    quota: UserQuota,
    usage: UserUsage,
    highest_baseline: int,
    settings: PrioritySettings = DEFAULT_SETTINGS,
) -> UserPriority:
    """One user's computed priority (thesis Listing 3.4, with the boost added to ``1 - w``).

    Args:
        quota: The user's baseline priority and quotas.
        usage: The user's usage now and over the last 24 h.
        highest_baseline: The highest baseline priority of any user (at least the user's own).
        settings: Weights and boost thresholds.

    Returns:
        The priority; ``BLOCKED_PRIORITY`` with a reason when a quota is reached.

    """
    reason = quota_block(quota, usage)
    if reason is not None:
        return UserPriority(BLOCKED_PRIORITY, reason)
    top = max(highest_baseline, quota.baseline_priority, 1)
    cost_q = math.sqrt(_unit(usage.cost_24h / quota.max_cost_24h))
    cores_q = _unit(usage.active_cores_mcpu / quota.max_active_cores_mcpu)
    baseline_q = 1.0 - _unit(quota.baseline_priority / top)
    w = (
        settings.cost_weight * cost_q
        + settings.active_cores_weight * cores_q
        + settings.priority_weight * baseline_q
    )
    b = boost(usage.cost_24h, settings)
    return UserPriority(b + (1.0 - w), None, b, w)


def compute_priorities(
    quotas: Mapping[str, UserQuota],
    usage: Mapping[str, UserUsage],
    settings: PrioritySettings = DEFAULT_SETTINGS,
) -> dict[str, UserPriority]:
    """Every configured user's computed priority, normalised by the highest baseline.

    Args:
        quotas: Baseline priority and quotas per user.
        usage: Usage per user; a user without an entry has used nothing.
        settings: Weights and boost thresholds.

    Returns:
        Priority per user of ``quotas``.

    """
    highest = max((q.baseline_priority for q in quotas.values()), default=1)
    idle = UserUsage()
    return {
        user: user_priority(q, usage.get(user, idle), highest, settings)
        for user, q in quotas.items()
    }


def _unit(x: float) -> float:
    return min(max(x, 0.0), 1.0)
