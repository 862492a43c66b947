"""The CPU this process may use, read from the kernel (:mod:`core.cpu_capacity` says why).

Reads the affinity (``sched_getaffinity``) and the CPU quotas of the process's cgroup and its
ancestors, in cgroup v2's unified hierarchy or v1's ``cpu`` one, wherever the CPU controller
is mounted under ``/sys/fs/cgroup``. Anything unreadable counts as no quota: the machine's
cores, as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from core.cpu_capacity import (
    Quota,
    ancestry,
    capacity,
    cgroup_path,
    parse_cfs,
    parse_cpu_max,
    whole_cores,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(*, cgroup_root: Path = CGROUP_ROOT,
                proc_cgroup: Path = PROC_SELF_CGROUP) -> float:
    """The CPUs' worth this process may use: its affinity's cores, capped by its cgroups'
    quotas (fractional: 1.5 under a quota of 150 ms per 100 ms)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return capacity(cores, ())
    return capacity(cores, _quotas(cgroup_root, text))


def usable_cores(**kwargs: Path) -> int:
    """:func:`usable_cpus` rounded up: how many processes keep it busy."""
    return whole_cores(usable_cpus(**kwargs))


def _quotas(root: Path, proc_cgroup: str) -> Iterator[Quota | None]:
    path = cgroup_path(proc_cgroup, v2=True)
    for mount in (root, root / "unified"):  # v2, alone or beside v1
        if path is not None and _has_cpu(mount / "cgroup.controllers"):
            for rel in ancestry(path):
                yield _read(_v2_quota, mount / rel)
    path = cgroup_path(proc_cgroup, v2=False)
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # v1
        mount = root / name
        if path is not None and (mount / "cpu.cfs_quota_us").exists():
            for rel in ancestry(path):
                yield _read(_v1_quota, mount / rel)
            return


def _v2_quota(directory: Path) -> Quota | None:
    return parse_cpu_max((directory / "cpu.max").read_text())


def _v1_quota(directory: Path) -> Quota | None:
    return parse_cfs((directory / "cpu.cfs_quota_us").read_text(),
                     (directory / "cpu.cfs_period_us").read_text())


def _has_cpu(path: Path) -> bool:
    try:
        return "cpu" in path.read_text().split()
    except OSError:
        return False


def _read(parse: Callable[[Path], Quota | None], directory: Path) -> Quota | None:
    """A level's quota; None where it has none, or where it cannot be read or parsed (the root
    of a hierarchy has no quota files; a container may not see its ancestors)."""
    try:
        return parse(directory)
    except (OSError, ValueError):
        return None
