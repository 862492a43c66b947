"""The local compute driver: each instance is a worker process (``python -m services.worker``).

An instance is a process in its own session listening on a free port of 127.0.0.1; it announces
itself with ``InstanceActivated`` on the log like a worker on a cloud VM would. Its output goes
to ``{data_dir}/instances/{name}.log``. Every worker reads job specs from the settings' spec root
and writes container logs to their log root (``HS_WORKER_SPEC_DIR`` / ``HS_WORKER_LOG_DIR``), the
directories ingest writes specs to and serves logs from. The driver remembers its processes in
memory: it owns them, and :meth:`LocalDriver.close` deletes every instance it started.

Idempotent by name (invariant 7): creating a name the driver already has does nothing, whether
its process still runs or has died (then :meth:`LocalDriver.list` says ``stopped``, as a cloud
lists a VM that stopped); deleting an unknown name does nothing. A driver that died without
closing (a killed scheduler) leaves its workers running: :func:`reap_instances` finds and stops
them by the data directory in their environment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import msgspec

from services.common import procs
from services.common.settings import Settings, log_env, log_root, spec_root
from services.scheduler.drivers.base import InstanceInfo, InstanceSpec, check_name

log = logging.getLogger(__name__)


class LocalDriverOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the local driver runs workers."""

    python: str = sys.executable
    # Extra environment for every worker (HS_WORKER_HEARTBEAT_S, say); the driver's own
    # HS_WORKER_INSTANCE_NAME/PORT/CORES_MCPU/REGION/LOG_DIR/SPEC_DIR win over these.
    worker_env: dict[str, str] = {}
    # How long a worker may take to shut down after SIGTERM before its group is SIGKILLed.
    terminate_timeout_s: float = 15.0


@dataclass(eq=False)
class _Instance:
    spec: InstanceSpec
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc.poll() is None  # poll() also reaps a worker that died


class LocalDriver:
    """Instances as local worker processes; a :class:`ComputeDriver` and async context manager."""

    def __init__(self, settings: Settings,
                 options: LocalDriverOptions | None = None) -> None:
        self._options = options or LocalDriverOptions()
        # Absolute, so a worker started from another directory writes where we look.
        self._data_dir = Path(settings.data_dir).resolve()
        self._env = {**log_env(settings.log), "HS_DATA_DIR": str(self._data_dir)}
        # The shared storage roots (absolute): where ingest writes specs and reads logs.
        self._storage_env = {"HS_WORKER_LOG_DIR": log_root(settings),
                             "HS_WORKER_SPEC_DIR": spec_root(settings)}
        self._instances: dict[str, _Instance] = {}
        # One lock per name, so calls about one instance never interleave.
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def log_path(self, name: str) -> Path:
        """Where the worker of instance ``name`` writes its output."""
        return self._data_dir / "instances" / f"{check_name(name)}.log"

    def pid(self, name: str) -> int | None:
        """The pid (and process group) of the worker of ``name``, if the driver has one."""
        instance = self._instances.get(name)
        return None if instance is None else instance.proc.pid

    async def create(self, spec: InstanceSpec) -> None:
        if self._closed:
            raise RuntimeError("the local driver is closed")
        check_name(spec.name)
        async with self._locks.setdefault(spec.name, asyncio.Lock()):
            if spec.name in self._instances:
                return
            port = procs.free_port()
            env = {**self._env, **self._options.worker_env, **self._storage_env,
                   "HS_WORKER_INSTANCE_NAME": spec.name, "HS_WORKER_PORT": str(port),
                   "HS_WORKER_CORES_MCPU": str(spec.cores_mcpu),
                   "HS_WORKER_REGION": spec.region}
            proc = await asyncio.to_thread(
                procs.spawn, [self._options.python, "-m", "services.worker"],
                log_path=self.log_path(spec.name), env=env)
            self._instances[spec.name] = _Instance(spec=spec, port=port, proc=proc)
            log.info("instance %s: worker pid %d on port %d", spec.name, proc.pid, port)

    async def delete(self, name: str) -> None:
        async with self._locks.setdefault(name, asyncio.Lock()):
            instance = self._instances.get(name)
            if instance is None:  # maybe a worker another scheduler (now dead) started
                if await asyncio.to_thread(reap_instances, self._data_dir, name):
                    log.info("instance %s: deleted (started by another scheduler)", name)
                return
            await asyncio.to_thread(self._stop, instance)
            del self._instances[name]
            log.info("instance %s: deleted", name)

    async def list(self) -> list[InstanceInfo]:
        return [InstanceInfo(name=name, inst_coll=i.spec.inst_coll, address=i.address,
                             state="running" if i.running() else "stopped")
                for name, i in self._instances.items()]

    async def close(self) -> None:
        """Delete every instance this driver started (idempotent); no creates afterwards."""
        self._closed = True
        await asyncio.gather(*(self.delete(name) for name in list(self._instances)))

    def _stop(self, instance: _Instance) -> None:
        proc = instance.proc
        if proc.poll() is None:
            procs.terminate(proc.pid, timeout=self._options.terminate_timeout_s)
        proc.wait(timeout=10)  # reaped by terminate already; this only tells the Popen object


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours
        return {}
    return dict(v.split("=", 1) for v in raw.decode(errors="replace").split("\0") if "=" in v)


def _is_worker(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"services.worker" in argv


def running_workers(data_dir: str | os.PathLike[str]) -> list[str]:
    """The instance names of worker processes of ``data_dir`` that run (Linux ``/proc``)."""
    return sorted(set(_left_over_workers(data_dir).values()))


def _left_over_workers(data_dir: str | os.PathLike[str]) -> dict[int, str]:
    """Worker processes of ``data_dir`` that run (Linux ``/proc``): pid -> instance name."""
    target = str(Path(data_dir).resolve())
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        env = _environ(int(entry))
        name = env.get("HS_WORKER_INSTANCE_NAME")
        if name and env.get("HS_DATA_DIR") == target and _is_worker(int(entry)) \
                and procs.pid_alive(int(entry)):
            found[int(entry)] = name
    return found


def reap_instances(data_dir: str | os.PathLike[str], name: str | None = None) -> list[str]:
    """Stop the workers local drivers started for ``data_dir`` that still run (Linux ``/proc``).

    For a stack or a test tearing down after a scheduler died without closing its driver, and
    for a new leader deleting an instance its predecessor created: a worker is known by
    ``HS_DATA_DIR`` (``data_dir``, resolved) and ``HS_WORKER_INSTANCE_NAME`` in its environment.
    Each one's process group is terminated as :meth:`LocalDriver.delete` does. With ``name``,
    only that instance. Returns the instance names stopped (sorted); idempotent.
    """
    found = {pid: n for pid, n in _left_over_workers(data_dir).items()
             if name is None or n == name}
    for pid, instance in found.items():
        procs.terminate(pid, timeout=LocalDriverOptions().terminate_timeout_s)
        log.info("instance %s: left-over worker pid %d stopped", instance, pid)
    return sorted(set(found.values()))
