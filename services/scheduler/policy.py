"""The scheduler's policy tiers: fair share alone (the reference), or JAliEn priorities first.

With ``HS_SCHEDULER_POLICY=priority`` the step's first tier is
:class:`core.policy.PriorityPlugin`: users are ordered by the thesis's computed priority
(baseline priority, cores running now, cost over 24 h, a boost for users with little recent
use) and users over a quota are refused. Priorities are recomputed every ``priority_s`` from
usage this replica measures: cores running per user, integrated over time into hourly buckets
of the last 24 h. The cost is core-seconds times ``cost_per_core_s`` (integer units). Usage
starts from zero on a new leader (it is not on the log yet); quotas come from settings
(``HS_SCHEDULER_QUOTAS``, JSON ``{user: {baseline_priority, max_active_cores_mcpu,
max_cost_24h}}``, and a default for everyone else).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import msgspec

from core.policy import PriorityPlugin, Tiers
from core.priority import UserQuota, UserUsage, compute_priorities
from core.scheduler_state import SchedulerState

HOUR_S = 3600.0
WINDOW_HOURS = 24


class QuotaSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One user's quota, as configured."""

    baseline_priority: int = 1_000
    max_active_cores_mcpu: int = 1_000_000_000
    max_cost_24h: int = 10**15


def parse_quotas(text: str) -> dict[str, QuotaSettings]:
    """``HS_SCHEDULER_QUOTAS``: JSON mapping users to quotas (ValueError if malformed)."""
    try:
        return msgspec.json.decode(text.encode(), type=dict[str, QuotaSettings])
    except msgspec.DecodeError as e:
        raise ValueError(f"HS_SCHEDULER_QUOTAS: {e}") from None


class UsageMeter:
    """Core-seconds per user over the last 24 h, in hourly buckets (the caller's clock)."""

    def __init__(self) -> None:
        self._buckets: deque[tuple[int, dict[str, float]]] = deque()
        self._last: float | None = None

    def observe(self, state: SchedulerState, now_s: float) -> None:
        """Add the cores running since the last observation to each user's usage."""
        last, self._last = self._last, now_s
        if last is None or now_s <= last:
            return
        hour = int(now_s // HOUR_S)
        if not self._buckets or self._buckets[-1][0] != hour:
            self._buckets.append((hour, {}))
        while self._buckets[0][0] <= hour - WINDOW_HOURS:
            self._buckets.popleft()
        bucket = self._buckets[-1][1]
        for (user, _), mcpu in state.running_mcpu.items():
            bucket[user] = bucket.get(user, 0.0) + mcpu / 1000 * (now_s - last)

    def core_seconds(self) -> dict[str, int]:
        """Each user's core-seconds over the window."""
        out: dict[str, float] = {}
        for _, bucket in self._buckets:
            for user, value in bucket.items():
                out[user] = out.get(user, 0.0) + value
        return {u: int(v) for u, v in out.items()}


class PriorityPolicy:
    """Recomputes the priority tier from quotas and measured usage."""

    def __init__(self, quotas: Mapping[str, QuotaSettings], default: QuotaSettings,
                 cost_per_core_s: int) -> None:
        self._quotas = dict(quotas)
        self._default = default
        self._cost_per_core_s = cost_per_core_s
        self.meter = UsageMeter()

    def tiers(self, state: SchedulerState, now_s: float) -> Tiers:
        """The tiers for the next steps: priorities from usage up to ``now_s``."""
        self.meter.observe(state, now_s)
        active: dict[str, int] = {}
        for (user, _), mcpu in state.running_mcpu.items():
            active[user] = active.get(user, 0) + mcpu
        users = {u for u, _ in state.ready} | set(active)
        core_s = self.meter.core_seconds()
        quotas = {u: self._quota(u) for u in users}
        usage = {u: UserUsage(active_cores_mcpu=active.get(u, 0),
                              cost_24h=core_s.get(u, 0) * self._cost_per_core_s,
                              core_seconds_24h=core_s.get(u, 0)) for u in users}
        return Tiers([[PriorityPlugin(compute_priorities(quotas, usage))]])

    def _quota(self, user: str) -> UserQuota:
        q = self._quotas.get(user, self._default)
        return UserQuota(baseline_priority=q.baseline_priority,
                         max_active_cores_mcpu=q.max_active_cores_mcpu,
                         max_cost_24h=q.max_cost_24h)
