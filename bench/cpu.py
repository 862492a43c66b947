"""Where the CPU goes: CPU seconds per component of a stack over a measured window.

A rate on this 2-core machine is bounded by the CPU each unit of work costs across every process
that touches it. This module samples ``/proc`` before and after a window and attributes CPU time
(user + system, plus reaped children) to components by command line: the broker (tansu), its
storage (SeaweedFS), MariaDB and each of our services; a worker's reaped children (the jobs it
ran, or its process spawner ran: the spawner itself counts as the worker) are a component of
their own, ``jobs (worker children)``. Only processes whose environment
carries the stack's ``HS_DATA_DIR`` are ours, so other stacks on the machine (tests running
beside a benchmark) are not counted; MariaDB is a shared server and is counted whole, which the
figures say. The machine's own busy time comes from ``/proc/stat``; with it, ``ceiling_per_s``
is how many units per second the machine could do if all of its CPU went to this work at the
measured cost per unit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from services.common.cpus import usable_cpus

_TICK = os.sysconf("SC_CLK_TCK")
_SERVICE = re.compile(r"-m\s+services\.(\w+)")


def _component(cmdline: str) -> str | None:
    if "mariadbd" in cmdline:
        return "mariadb (shared)"
    if "weed" in cmdline.split(" ")[0]:  # before tansu: its bucket is named "tansu"
        return "storage (seaweedfs)"
    if "tansu" in cmdline:
        return "broker (tansu)"
    m = _SERVICE.search(cmdline)
    if m:
        return "stack cli" if m.group(1) == "stack" else m.group(1)
    if "hail_submit" in cmdline:
        return "client (hailtop)"
    return None


JOBS = "jobs (worker children)"
"""The component of the processes the workers ran (and reaped): the jobs themselves."""


def _proc_cpu(pid: str) -> tuple[float, float]:
    """CPU seconds of ``pid``: its own user + system, and that of its reaped children."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / _TICK, (cutime + cstime) / _TICK


def _ours(pid: str, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def processes(marker: bytes) -> dict[tuple[int, bool], tuple[str, float]]:
    """(pid, children?) -> (component, CPU seconds so far) of the processes whose environment
    has ``marker`` (``HS_DATA_DIR=...`` of a stack, say), and MariaDB's; a process's reaped
    children count as it does, except a worker's (:data:`JOBS`)."""
    out: dict[tuple[int, bool], tuple[str, float]] = {}
    spawners: list[str] = []  # a worker's process spawner has an empty environment: by parent
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if cmdline.split(" ")[0].endswith("/hs-spawner"):
                spawners.append(entry)
                continue
            component = _component(cmdline)
            if component is None:
                continue
            if component != "mariadb (shared)" and not _ours(entry, marker):
                continue
            _count(out, entry, component)
        except (OSError, ValueError):
            continue  # exited while we looked
    workers = {pid for (pid, _), (component, _) in out.items() if component == "worker"}
    for entry in spawners:
        try:
            if _parent(entry) in workers:
                _count(out, entry, "worker")  # it starts and reaps the worker's jobs
        except (OSError, ValueError):
            continue
    return out


def _count(out: dict[tuple[int, bool], tuple[str, float]], pid: str, component: str) -> None:
    own, children = _proc_cpu(pid)
    if component == "worker":
        out[(int(pid), False)] = (component, own)
        out[(int(pid), True)] = (JOBS, children)
    else:
        out[(int(pid), False)] = (component, own + children)


def _parent(pid: str) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def machine_busy() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICK, sum(fields[:8]) / _TICK


@dataclass
class Window:
    """CPU seconds per component between :meth:`start` and :meth:`stop`.

    ``marker`` selects the processes (``HS_DATA_DIR=<dir>`` for a stack); ``own`` names the
    component the benchmark's own process is counted as, if it does the work itself.
    """

    marker: bytes
    own: str | None = None
    children: bool = True
    children_as: str = "client (hailtop)"
    """The component the benchmark's reaped children count as."""
    _before: dict[tuple[int, bool], tuple[str, float]] | None = None
    _busy: tuple[float, float] = (0.0, 0.0)
    _children: float = 0.0
    _self: float = 0.0

    @classmethod
    def of_stack(cls, data_dir: str) -> Window:
        return cls(f"HS_DATA_DIR={data_dir}".encode())

    def start(self) -> None:
        self._before = processes(self.marker)
        self._busy = machine_busy()
        t = os.times()
        self._children, self._self = t.children_user + t.children_system, t.user + t.system

    def stop(self, units: int, unit: str = "job", extra: dict[str, float] | None = None
             ) -> dict[str, object]:
        """Figures for ``units`` units of work done in the window, per component and in all.

        Processes that started in the window count from zero; processes that ended in it are
        lost, except the benchmark's own children (the hailtop client, or ``children_as``),
        taken from ``os.times`` unless ``children`` is off; ``extra`` adds CPU seconds measured
        elsewhere.
        """
        assert self._before is not None, "start() first"
        after = processes(self.marker)
        busy, total = machine_busy()
        per: dict[str, float] = {}
        for pid, (component, cpu) in after.items():
            then = self._before.get(pid)
            per[component] = per.get(component, 0.0) + cpu - (then[1] if then else 0.0)
        t = os.times()
        children = t.children_user + t.children_system - self._children
        if self.children and children > 0:
            per[self.children_as] = per.get(self.children_as, 0.0) + children
        for component, seconds in (extra or {}).items():
            per[component] = per.get(component, 0.0) + seconds
        if self.own:
            per[self.own] = per.get(self.own, 0.0) + t.user + t.system - self._self
        wall_cpu = total - self._busy[1]
        machine = busy - self._busy[0]
        ours = sum(v for k, v in per.items() if k != "mariadb (shared)")
        all_cpu = ours + per.get("mariadb (shared)", 0.0)
        ms = {k: round(1000 * v / units, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
        return {
            f"cpu_ms_per_{unit}": ms,
            # The same in seconds: a 1M submit's few microseconds per job round to nothing.
            "cpu_seconds": {k: round(v, 2) for k, v in sorted(per.items(),
                                                             key=lambda kv: -kv[1])},
            "cpu_seconds_total": round(all_cpu, 2),
            f"cpu_ms_per_{unit}_total": round(1000 * all_cpu / units, 3),
            "machine_busy_share": round(machine / wall_cpu, 3) if wall_cpu else 0.0,
            "stack_share_of_machine_busy": round(all_cpu / machine, 3) if machine else 0.0,
            # Every CPU this run may use: the cores, or a CPU quota it is held to (--cpu-quota).
            "ceiling_per_s": round(units / all_cpu * usable_cpus()) if all_cpu else None,
        }
