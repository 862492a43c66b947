"""What the stack started: ``stack.json`` under the data directory.

Each process is recorded with its pid and its kernel start time, so a recycled pid is never
mistaken for (or killed as) one of ours.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from services.common import procs


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One process started by `up`."""

    name: str
    pid: int
    port: int
    log: str
    argv: list[str]
    started_at: float
    # Field 22 of /proc/<pid>/stat: distinguishes our process from a later one with its pid.
    proc_start: int | None = None


class StackState(msgspec.Struct, kw_only=True):
    """The stack's processes in start order, and whether it started MariaDB."""

    mode: str | None = None
    processes: list[ProcessRecord] = msgspec.field(default_factory=list)
    db_started: bool = False

    def get(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def put(self, record: ProcessRecord) -> None:
        self.processes = [p for p in self.processes if p.name != record.name] + [record]

    def remove(self, name: str) -> None:
        self.processes = [p for p in self.processes if p.name != name]


def load_state(path: Path) -> StackState:
    """The recorded state, or an empty one when there is none (or it is unreadable)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=StackState)
    except FileNotFoundError:
        return StackState()
    except (msgspec.DecodeError, msgspec.ValidationError):
        # A corrupt state file must not block `down`/`up`; the processes it named are orphaned
        # and show up as port conflicts.
        return StackState()


def save_state(path: Path, state: StackState) -> None:
    """Write the state atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    os.replace(tmp, path)


def proc_start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` in clock ticks, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after it are space separated.
    rest = stat[stat.rindex(")") + 2:].split()
    return int(rest[19])


def record_process(name: str, pid: int, port: int, log: Path, argv: list[str]) -> ProcessRecord:
    """A record of a process just started."""
    return ProcessRecord(name=name, pid=pid, port=port, log=str(log), argv=argv,
                         started_at=time.time(), proc_start=proc_start_time(pid))


def is_alive(record: ProcessRecord) -> bool:
    """Whether the recorded process still runs (and is the one we started)."""
    if not procs.pid_alive(record.pid):
        return False
    return record.proc_start is None or proc_start_time(record.pid) == record.proc_start
