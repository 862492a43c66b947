"""How much CPU a process may use: the cores it may run on, capped by its cgroups' CPU quotas.

``os.cpu_count()`` counts the machine's cores. A process in a container with a CPU limit (a
Kubernetes pod's ``limits.cpu``, a cgroup's quota, as ``bench --cpu-quota`` sets one) or pinned
to some cores may use fewer: the rebuild started a lane process per machine core, and a
worker offered every machine core to the scheduler. Held to one core's worth of a 2-core
machine, the rebuild replayed 71,962 events/s with two lanes and 79,864 with one (2026-12-07).

The kernel enforces a quota as ``quota_us`` of CPU time per ``period_us`` for every process of a
cgroup together, and a cgroup's limit holds for everything under it: the capacity is the
smallest of the affinity's cores and each quota of the process's cgroup and its ancestors.

Pure: the readers in :mod:`services.common.cpus` pass what they read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

Quota = tuple[int, int]
"""A cgroup's CPU quota: (quota_us, period_us), CPU time per period."""


def capacity(cores: int, quotas: Iterable[Quota | None]) -> float:
    """The CPUs' worth a process may use.

    ``cores`` (those it may run on, at least 1), capped by each of ``quotas`` (None: no quota
    at that level).
    """
    limit = float(max(1, cores))
    for quota in quotas:
        if quota is not None:
            limit = min(limit, quota[0] / quota[1])
    return limit


def whole_cores(cpus: float) -> int:
    """The processes or threads to keep ``cpus`` busy: ``cpus`` rounded up, at least 1."""
    return max(1, math.ceil(round(cpus, 6)))


def parse_cpu_max(text: str) -> Quota | None:
    """The quota of a v2 cgroup's ``cpu.max``, or None for none.

    ``"max 100000"`` has none, ``"50000 100000"`` half a CPU. ValueError for anything else.
    """
    parts = text.split()
    if len(parts) == 1:  # the period may be left out when writing; reading gives both
        parts.append("100000")
    if len(parts) != 2:
        raise ValueError(f"not a cpu.max: {text!r}")
    period = int(parts[1])
    if parts[0] == "max":
        return None
    return _quota(int(parts[0]), period, text)


def parse_cfs(quota_us: str, period_us: str) -> Quota | None:
    """The quota of a v1 cgroup's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``.

    None for none (a quota of -1). ValueError for anything else.
    """
    quota = int(quota_us.strip())
    if quota == -1:
        return None
    return _quota(quota, int(period_us.strip()), f"{quota_us.strip()} {period_us.strip()}")


def _quota(quota: int, period: int, text: str) -> Quota:
    if quota <= 0 or period <= 0:
        raise ValueError(f"not a CPU quota: {text!r}")
    return quota, period


def cgroup_path(proc_cgroup: str, *, v2: bool) -> str | None:
    """The process's cgroup path in the CPU controller's hierarchy, or None.

    From ``/proc/<pid>/cgroup``: v2's is the ``0::`` line, v1's the line whose controllers
    include ``cpu``.
    """
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (v2 and number == "0" and controllers == "") or (
                not v2 and "cpu" in controllers.split(",")):
            return path
    return None


def ancestry(path: str) -> list[str]:
    """A cgroup's path and each of its ancestors up to the root, as relative paths.

    ``/a/b`` gives ``["a/b", "a", ""]``.
    """
    parts = [p for p in path.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]
