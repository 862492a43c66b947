"""Hold the bench, and the database server it talks to, to a share of the machine's CPU.

Why: this VM's speed moves by half within an hour (``bench/machine.py``), and the figures that
miss their targets miss them at slow hours, which come when they come. A CPU quota makes a slow
machine on demand: every process of the bench (the stack, the client, the jobs) and the
machine's MariaDB share ``cores`` of CPU time, enforced by the kernel every ``period_us``. It
is not the same as a slow hour (a single thread alone still runs at full speed; the whole
stack together gets less), but it puts the stack where slow hours put it: every core busy,
the request path competing with the projection. Held to 0.8 of a core at a fast hour (probe
13), the 1M submit's server part took 16.6-18.1 s, what it takes at probe 4-5.

A cgroup of the CPU controller is made beside the one the bench runs in (cgroup v1's ``cpu``
hierarchy, or v2's unified one when it has the ``cpu`` controller), the bench's process moved
into it (its children follow), and the database server's processes too; on leaving, each
process goes back to the cgroup it came from and the cgroup is removed. It needs write access
to the cgroup file system (root on this VM).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
PERIOD_US = 10_000
"""A short period: the quota is spread over each 10 ms instead of spent in bursts."""
SERVER_COMMANDS = ("mariadbd", "mysqld")


class QuotaError(Exception):
    """The quota cannot be set here; the message says why."""


@dataclass(frozen=True)
class Hierarchy:
    """Where the CPU controller is mounted, and which of cgroup v1 and v2 it is."""

    mount: Path
    v2: bool

    def limit(self, group: Path, cores: float, period_us: int) -> None:
        quota = max(1_000, round(cores * period_us))
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {period_us}\n")
        else:
            (group / "cpu.cfs_period_us").write_text(f"{period_us}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")

    def group_of(self, pid: int, proc: Path = PROC) -> Path:
        """The cgroup ``pid`` is in, in this hierarchy."""
        for line in (proc / str(pid) / "cgroup").read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            if (self.v2 and number == "0" and controllers == "") or (
                    not self.v2 and "cpu" in controllers.split(",")):
                return self.mount / path.lstrip("/")
        raise QuotaError(f"process {pid} is in no cgroup of {self.mount}")


def find_hierarchy(root: Path = CGROUP_ROOT) -> Hierarchy:
    """The CPU controller's hierarchy under ``root``; QuotaError when there is none."""
    for name in ("cpu", "cpu,cpuacct"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return Hierarchy(root / name, v2=False)
    for mount in (root, root / "unified"):
        controllers = mount / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return Hierarchy(mount, v2=True)
    raise QuotaError(f"no cgroup hierarchy with the CPU controller under {root}")


def server_pids(proc: Path = PROC) -> list[int]:
    """The processes of a database server on this machine."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in SERVER_COMMANDS:
                    found.append(int(entry.name))
    return sorted(found)


def _move(pid: int, group: Path) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone meanwhile
        (group / "cgroup.procs").write_text(f"{pid}\n")


@contextlib.contextmanager
def cpu_quota(cores: float, pids: Iterable[int] | None = None, *,
              root: Path = CGROUP_ROOT, proc: Path = PROC,
              period_us: int = PERIOD_US) -> Iterator[Path]:
    """Hold ``pids`` (default: this process and the database server's) and their new children
    to ``cores`` of CPU while inside; yields the cgroup."""
    if not 0 < cores <= (os.cpu_count() or 1):
        raise QuotaError(f"a quota of {cores} cores: expected more than 0 and at most the "
                         f"machine's {os.cpu_count()}")
    hierarchy = find_hierarchy(root)
    members = sorted({os.getpid(), *server_pids(proc)} if pids is None else set(pids))
    home = hierarchy.group_of(os.getpid(), proc)
    group = home / f"hs-bench-quota-{os.getpid()}"
    try:
        group.mkdir()
        hierarchy.limit(group, cores, period_us)
    except OSError as e:
        with contextlib.suppress(OSError):
            group.rmdir()
        raise QuotaError(f"cannot make a CPU quota in {home}: {e}") from e
    came_from = {pid: hierarchy.group_of(pid, proc) for pid in members}
    try:
        for pid in members:
            _move(pid, group)
        yield group
    finally:
        for pid, origin in came_from.items():
            _move(pid, origin)
        # Whatever else is left (a process started inside that outlived the bench) goes home.
        with contextlib.suppress(OSError):
            for line in (group / "cgroup.procs").read_text().split():
                _move(int(line), home)
        with contextlib.suppress(OSError):
            group.rmdir()
