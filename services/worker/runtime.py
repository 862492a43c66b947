"""Running one container of a job attempt on this machine, independent of Kafka and HTTP.

A :class:`ContainerRuntime` takes a :class:`RunRequest` (command, environment, working directory,
timeout) and a :class:`LogSink`, and returns an :class:`Outcome`: it never raises for anything the
job did (a non-zero exit, a missing executable, a timeout, a cancellation); only infrastructure
faults of the worker itself escape.

:class:`LocalProcessRuntime` runs the command as a local process in its own process group and
ignores the image: it is the runtime of the local stack and of tests. The process is started and
reaped by the worker's process spawner (:mod:`services.worker.spawner`, a small C helper) where
it is built, else with ``Popen`` from the worker itself; the outcome is the same either way. On
VMs a container runtime (the reference uses ``crun`` with an OCI bundle; docker would do) plugs
in behind the same Protocol, so the worker's job logic does not change.

The outcome follows the reference worker:

* exit code 0 is ``Success``, any other exit code ``Failed``; death by signal N reports 128+N, as
  crun and docker do.
* a timeout kills the process group and is an ``Error`` with the reference's error text
  ``ContainerTimeoutError: timed out after {timeout}s`` and short error ``timed out``.
* a command that cannot be started (no such executable, not executable, no working directory)
  is an ``Error``; the text follows crun's, e.g. ``executable file `foo` not found in $PATH``.
* cancelling the task running :meth:`LocalProcessRuntime.run` kills the process group and the
  run *returns* a ``Cancelled`` outcome (the cancellation is consumed: the caller that cancelled
  awaits the task for the outcome).

Like a container's pid namespace, the process group dies with its leader: when the command exits,
whatever it left running in its group is killed. A process that leaves the group (``setsid``)
escapes; only a real container runtime (or a cgroup) can catch that.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import select
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from schemas.base import CompletedJobState
from services.worker.spawner import HelperChild, Spawner, SpawnerGone, helper_path

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def time_ms() -> int:
    """Wall-clock milliseconds since the epoch (the default clock)."""
    return time.time_ns() // 1_000_000


class LogSink(Protocol):
    """Where a container's stdout and stderr go, in the order the bytes were written."""

    def write(self, data: bytes) -> None:
        """Append ``data`` to the log."""
        ...


class MemoryLogSink:
    """A log kept in memory (tests, small jobs)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        self._buf += data

    def getvalue(self) -> bytes:
        return bytes(self._buf)


class FileLogSink:
    """A log written, unbuffered, to ``{directory}/{name}.log`` (created or truncated).

    Unbuffered so that a log endpoint reading the file while the job runs sees every byte the
    job wrote. Close it (or use it as a context manager) when the container is done.
    """

    _file: io.FileIO | None

    def __init__(self, directory: str | os.PathLike[str], name: str = "main") -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self._path = os.path.join(directory, f"{name}.log")
        self._file = open(self._path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self._handed_off = False

    @property
    def path(self) -> Path:
        """The log file."""
        return Path(self._path)

    @classmethod
    def at(cls, path: str) -> FileLogSink:
        """A log written to the file ``path`` itself; its directory must exist
        (FileNotFoundError otherwise): no directory is created, which costs a short job."""
        sink = cls.__new__(cls)
        sink._path = path
        sink._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        sink._handed_off = False
        return sink

    @classmethod
    def lazy(cls, path: str) -> FileLogSink:
        """A log at ``path`` made (truncated, and its directory too) on the first write or
        ``fileno()``: a job that writes nothing costs no file, the largest single cost of a
        no-op job's worker. Closed unmade, it removes a file an earlier run left there, so the
        log read afterwards is this run's (none) either way."""
        sink = cls.__new__(cls)
        sink._path = path
        sink._file = None
        sink._handed_off = False
        return sink

    @property
    def unopened_path(self) -> str | None:
        """The file's path while nothing has made it (a :meth:`lazy` sink), else None."""
        return self._path if self._file is None and not self._handed_off else None

    def hand_off(self) -> None:
        """Something else (the process spawner) writes the file from here on, and makes it or
        removes a stale one: closing this sink no longer removes it. (A write after all, of a
        process that never started, makes the file.)"""
        self._handed_off = True

    def _open(self) -> io.FileIO:
        try:
            file = open(self._path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        except FileNotFoundError:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            file = open(self._path, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self._file = file
        return file

    def write(self, data: bytes) -> None:
        (self._file or self._open()).write(data)

    def fileno(self) -> int:
        """The file's descriptor (made now, if lazy): a local process writes its output here
        directly."""
        return (self._file or self._open()).fileno()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        elif not self._handed_off:
            self._handed_off = True  # closed: nothing to remove a second time
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(self._path)

    def __enter__(self) -> FileLogSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One command to run: ``env`` is added on top of the runtime's minimal environment."""

    command: list[str]
    env: dict[str, str] = {}
    cwd: str
    timeout_s: float | None = None
    image: str | None = None  # for container runtimes; the local runtime ignores it


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one container run ended.

    ``exit_code`` is the process's exit code (128+N after signal N), None when it never started.
    ``error`` is set exactly when ``state`` is ``Error``; ``short_error`` is the reference's short
    form (``timed out``, ``executable not found``...). ``workdir_empty`` is True when the
    runtime saw the working directory empty once the process had ended (the process spawner
    looks, where it writes the log), None where nothing looked.
    """

    state: CompletedJobState
    exit_code: int | None = None
    error: str | None = None
    short_error: str | None = None
    timed_out: bool = False
    out_of_memory: bool = False
    start_time_ms: int
    end_time_ms: int
    workdir_empty: bool | None = None


class ContainerRuntime(Protocol):
    """Runs one container to completion; see the module docstring for the outcome rules."""

    async def run(self, request: RunRequest, log: LogSink) -> Outcome:
        """Run ``request``, streaming its output to ``log``."""
        ...


class LocalRuntimeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the local runtime starts and stops processes."""

    # SIGTERM first, SIGKILL after this grace (the reference waits 5 s between the two).
    kill_grace_s: float = 5.0
    # After the process is gone, how long to wait for its output pipe to close.
    drain_timeout_s: float = 5.0
    base_env: dict[str, str] = msgspec.field(
        default_factory=lambda: {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"})
    # The process spawner that starts and reaps the processes (services/worker/spawner), or
    # None to start them with Popen from the worker itself. Default: the one built beside the
    # venv's Python, unless HS_WORKER_SPAWNER says otherwise.
    spawner: str | None = msgspec.field(default_factory=helper_path)


def timeout_error(timeout_s: float) -> str:
    """The reference's error for a container killed at its timeout."""
    return f"ContainerTimeoutError: timed out after {timeout_s}s"


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a container exit code: -N (killed by signal N) becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def request_from_spec(
    spec: Mapping[str, Any], *, cwd: str | os.PathLike[str],
    extra_env: Mapping[str, str] | None = None,
) -> RunRequest:
    """The main container of a docker-type job spec (as submitted) as a :class:`RunRequest`.

    The spec's ``env`` list overrides the runtime's base environment; ``extra_env`` (the
    worker's ``HAIL_*`` variables) overrides both.
    """
    process = spec["process"]
    if process.get("type") != "docker":
        raise ValueError(f"not a docker job: process.type is {process.get('type')!r}")
    env = {var["name"]: var["value"] for var in spec.get("env") or []}
    env.update(extra_env or {})
    timeout = spec.get("timeout")
    return RunRequest(command=list(process["command"]), env=env, cwd=os.fspath(cwd),
                      timeout_s=timeout, image=process.get("image"))


class _SinkProtocol(asyncio.Protocol):
    """Reads the job's output pipe straight into the sink, so the log keeps write order."""

    def __init__(self, sink: LogSink, closed: asyncio.Future[None]) -> None:
        self._sink = sink
        self._closed = closed

    def data_received(self, data: bytes) -> None:
        self._sink.write(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)


class _Reaper:
    """Tells the loop's children that they ended, through one epoll set of their pidfds.

    Linux tells of a process's end through a pidfd, so waiting costs no thread per process
    (Python 3.11's asyncio child watcher starts one per subprocess, which was a measurable share
    of a no-op job's cost). The pidfds go into a private epoll set, and only that set is the
    loop's reader: a start costs one ``epoll_ctl`` (closing the pidfd takes it out again), where
    a reader per pidfd cost the loop a handle and four or five system calls to add and remove
    (uvloop checks and sets up each descriptor it is given). One reaper per event loop, while
    that loop has children; it closes once none has run for ``IDLE_S`` (not as soon as the last
    ended: a worker's children come and go, and a set per burst would cost more than it saves).
    """

    IDLE_S = 2.0

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reaper] = (
        weakref.WeakKeyDictionary())

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll = select.epoll()
        self._children: dict[int, _Child] = {}  # by pidfd
        self._idle: asyncio.TimerHandle | None = None  # the close, once no child runs
        loop.add_reader(self._epoll.fileno(), self._on_ready)

    @classmethod
    def watch(cls, loop: asyncio.AbstractEventLoop, pidfd: int, child: _Child) -> None:
        """Resolve ``child`` once ``pidfd`` (now the reaper's, to close) says it ended."""
        reaper = cls._by_loop.get(loop)
        if reaper is None:
            reaper = cls._by_loop[loop] = cls(loop)
        try:
            reaper._epoll.register(pidfd, select.EPOLLIN)
        except BaseException:
            os.close(pidfd)
            reaper._on_idle()
            raise
        reaper._children[pidfd] = child

    def _on_ready(self) -> None:
        for pidfd, _ in self._epoll.poll(0):
            child = self._children.pop(pidfd, None)
            os.close(pidfd)  # also takes it out of the set
            if child is not None:
                child.ended()
        self._on_idle()

    def _on_idle(self) -> None:
        """Close in ``IDLE_S`` unless a child runs then (one timer at a time)."""
        if not self._children and self._idle is None:
            self._idle = self._loop.call_later(self.IDLE_S, self._close_if_idle)

    def _close_if_idle(self) -> None:
        self._idle = None
        if self._children:
            return  # the next idle moment sets the timer again
        if self._by_loop.get(self._loop) is self:
            del self._by_loop[self._loop]
        if not self._loop.is_closed():
            self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()


class _Child:
    """A started process and a future of its return code, resolved from the event loop (by
    the :class:`_Reaper`; where pidfds are missing, a thread waits)."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.pid = popen.pid
        self._popen = popen
        self._loop = loop
        self.workdir_empty: bool | None = None  # nothing looks
        self.exited: asyncio.Future[int] = loop.create_future()
        try:
            pidfd = os.pidfd_open(popen.pid)
        except OSError:  # no pidfds (old kernel): a thread blocks in waitpid instead
            loop.run_in_executor(None, self._wait_blocking)
            return
        _Reaper.watch(loop, pidfd, self)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def signal_group(self, sig: int) -> None:
        """Signal the process group (its leader unreaped: the pid is still ours)."""
        _killpg(self.pid, sig)

    def sweep(self) -> None:
        """Kill whatever is left in the process group (its leader has ended, or must)."""
        _killpg(self.pid, signal.SIGKILL)

    def ended(self) -> None:
        """The process has ended: collect its return code (waitpid returns at once)."""
        self._resolve(self._popen.wait())

    def _wait_blocking(self) -> None:
        code = self._popen.wait()
        self._loop.call_soon_threadsafe(self._resolve, code)

    def _resolve(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    async def wait(self) -> int:
        """The return code once the process ended; cancelling the wait leaves it running."""
        return await asyncio.shield(self.exited)


class LocalProcessRuntime:
    """Runs a container's command as a local process in a new session (its own process group).

    A :meth:`FileLogSink.lazy` log file not made yet is handed to the process spawner, which
    reads the process's output from a pipe and makes the file on the first byte; any other sink
    with a ``fileno()`` (a log file) becomes the process's stdout and stderr directly; any
    other sink is fed from a pipe by the event loop.
    """

    def __init__(self, settings: LocalRuntimeSettings | None = None, *,
                 clock: Callable[[], int] = time_ms) -> None:
        self._settings = settings or LocalRuntimeSettings()
        self._clock = clock

    def _env(self, request: RunRequest) -> dict[str, str]:
        return {**self._settings.base_env, **request.env}

    def _start_error(self, start: int, message: str, short: str, log: LogSink) -> Outcome:
        # Also into the log, as crun writes it to the container's output.
        log.write(f"{message}\n".encode())
        return Outcome(state="Error", error=message, short_error=short,
                       start_time_ms=start, end_time_ms=self._clock())

    async def run(self, request: RunRequest, log: LogSink) -> Outcome:
        start = self._clock()
        refused = _refusal(request)
        if refused is not None:
            return self._start_error(start, *refused, log)
        loop = asyncio.get_running_loop()
        if isinstance(log, FileLogSink) and log.unopened_path is not None \
                and self._settings.spawner is not None:
            return await self._run_logged(request, log, log.unopened_path, start, loop)
        fileno = getattr(log, "fileno", None)
        if callable(fileno):
            return await self._run(request, log, int(fileno()), None, start, loop)
        pipe, write_fd = _pipe()
        closed: asyncio.Future[None] = loop.create_future()
        try:
            transport, _ = await loop.connect_read_pipe(
                lambda: _SinkProtocol(log, closed), pipe)
        except BaseException:
            pipe.close()
            os.close(write_fd)
            raise
        try:
            return await self._run(request, log, write_fd, closed, start, loop)
        finally:
            transport.close()

    async def _run_logged(self, request: RunRequest, log: FileLogSink, path: str, start: int,
                          loop: asyncio.AbstractEventLoop) -> Outcome:
        """Have the spawner start the process and write its output to ``path`` itself, making
        the file only if there is output; Popen and the file opened here where it cannot."""
        assert self._settings.spawner is not None
        proc: _Child | HelperChild | None = None
        try:
            env = self._env(request)
            proc = Spawner.for_loop(loop, self._settings.spawner).start(
                request.command, env, request.cwd, log_path=path,
                drain_s=self._settings.drain_timeout_s)
            if proc is None:  # a request too big for the spawner
                proc = _Child(_spawn(request, env, log.fileno()), loop)
            else:
                log.hand_off()
        except OSError as e:
            return self._start_error(start, *_failure(request, e), log)
        return await self._supervise(proc, request, start, None, log)

    async def _run(self, request: RunRequest, log: LogSink, out_fd: int,
                   closed: asyncio.Future[None] | None, start: int,
                   loop: asyncio.AbstractEventLoop) -> Outcome:
        """Start the process with ``out_fd`` as its output (a pipe's write end, closed here
        once the child has it, when ``closed`` is the pipe reader's end-of-file)."""
        proc: _Child | HelperChild | None = None
        try:
            env = self._env(request)
            if self._settings.spawner is not None:
                proc = Spawner.for_loop(loop, self._settings.spawner).start(
                    request.command, env, request.cwd, out_fd)
            if proc is None:  # no spawner, or a request too big for it
                proc = _Child(_spawn(request, env, out_fd), loop)
        except OSError as e:
            return self._start_error(start, *_failure(request, e), log)
        finally:
            if closed is not None:
                os.close(out_fd)
        return await self._supervise(proc, request, start, closed, log)

    async def _supervise(self, proc: _Child | HelperChild, request: RunRequest, start: int,
                         closed: asyncio.Future[None] | None, log: LogSink) -> Outcome:
        timed_out = cancelled = False
        not_started: OSError | None = None
        try:
            try:
                if request.timeout_s is None:  # most jobs: no timer to arm and disarm
                    await proc.wait()
                else:
                    async with asyncio.timeout(request.timeout_s):
                        await proc.wait()
            except TimeoutError:
                timed_out = True
                await self._kill(proc)
        except asyncio.CancelledError:
            cancelled = True
            _uncancel()
            # A second cancel must not leave the process behind: finish the kill regardless.
            await asyncio.shield(self._kill(proc))
        except OSError as e:  # the spawner's exec failed (or the spawner ended)
            not_started = e
        finally:
            proc.sweep()  # whatever the leader left in its group
        if closed is not None:
            try:
                async with asyncio.timeout(self._settings.drain_timeout_s):
                    await asyncio.shield(closed)
            except TimeoutError:
                pass  # a process that left the group holds the pipe: its output is lost
            except asyncio.CancelledError:
                cancelled = True
                _uncancel()
        end = self._clock()
        if proc.returncode is None:  # it never ran (the spawner's exec failed)
            if cancelled and not_started is None:
                return Outcome(state="Cancelled", start_time_ms=start, end_time_ms=end)
            failure = not_started or _exec_failure(proc)
            if isinstance(failure, SpawnerGone):
                return self._start_error(start, f"worker error: {failure.strerror}",
                                         "worker error", log)
            return self._start_error(start, *_failure(request, failure), log)
        code = exit_code_of(proc.returncode)
        if cancelled:
            return Outcome(state="Cancelled", exit_code=code, start_time_ms=start,
                           end_time_ms=end)
        if timed_out:
            assert request.timeout_s is not None
            return Outcome(state="Error", exit_code=code, error=timeout_error(request.timeout_s),
                           short_error="timed out", timed_out=True, start_time_ms=start,
                           end_time_ms=end)
        return Outcome(state="Success" if code == 0 else "Failed", exit_code=code,
                       start_time_ms=start, end_time_ms=end,
                       workdir_empty=proc.workdir_empty)

    async def _kill(self, proc: _Child | HelperChild) -> None:
        """SIGTERM the process group, then SIGKILL it if the leader outlives the grace period."""
        if proc.returncode is None and not proc.exited.done():
            proc.signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(self._settings.kill_grace_s):
                    await proc.wait()
            except TimeoutError:
                proc.signal_group(signal.SIGKILL)
                await proc.wait()
            except OSError:
                return  # it never started
        proc.sweep()


def _spawn(request: RunRequest, env: dict[str, str], out_fd: int) -> subprocess.Popen[bytes]:
    """Start the process in its own session with ``out_fd`` as stdout and stderr.

    Called on the event loop on purpose: starting a process (vfork and exec) takes well under
    a millisecond and returns at once; only waiting for it would block, and that goes through
    :class:`_Child`. The exec's own errors (no such file, permission denied) raise here.
    """
    return subprocess.Popen(request.command, stdin=_devnull(), stdout=out_fd,
                            stderr=out_fd, env=env, cwd=request.cwd, start_new_session=True)


_DEVNULL: list[int] = []


def _devnull() -> int:
    """A descriptor of ``/dev/null`` for the jobs' stdin, opened once per process (not
    inherited: the child gets it as its fd 0): ``subprocess.DEVNULL`` opens and closes the
    device again for every process."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


def _refusal(request: RunRequest) -> tuple[str, str] | None:
    """Why ``request`` cannot even be tried (error, short error), or None."""
    if not request.command:
        return "empty command", "empty command"
    return None


def _failure(request: RunRequest, e: OSError) -> tuple[str, str]:
    """The error of a start that failed: a missing working directory fails it as a missing
    executable does (ENOENT), so the directory is looked at here, once a start has failed,
    not before every start (a ``stat`` per job, 3% of the worker's samples)."""
    if isinstance(e, FileNotFoundError | NotADirectoryError) and not os.path.isdir(request.cwd):
        return f"working directory `{request.cwd}` does not exist", "no working directory"
    return _start_failure(request.command[0], e)


def _pipe() -> tuple[io.FileIO, int]:
    """The job's output pipe: the read end as a file (the transport owns it), the write end."""
    read_fd, write_fd = os.pipe()
    return open(read_fd, "rb", buffering=0), write_fd


def _uncancel() -> None:
    """We consume a cancellation (the outcome reports it): tell the task, as asyncio asks."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _exec_failure(proc: _Child | HelperChild) -> OSError:
    """Why a process that never ran did not (its ``exited`` holds the error)."""
    error = proc.exited.exception() if proc.exited.done() else None
    return error if isinstance(error, OSError) else OSError("the process never started")


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _start_failure(argv0: str, e: OSError) -> tuple[str, str]:
    """crun's wording for a container process that cannot be executed."""
    where = "" if "/" in argv0 else " in $PATH"
    if isinstance(e, FileNotFoundError):
        return f"executable file `{argv0}` not found{where}: No such file or directory", (
            "executable not found")
    if isinstance(e, PermissionError):
        return f"executable file `{argv0}`: Permission denied", "permission denied"
    return f"cannot execute `{argv0}`: {e.strerror or e}", "cannot execute"


__all__: Sequence[str] = (
    "ContainerRuntime",
    "FileLogSink",
    "LocalProcessRuntime",
    "LocalRuntimeSettings",
    "LogSink",
    "MemoryLogSink",
    "Outcome",
    "RunRequest",
    "exit_code_of",
    "request_from_spec",
    "time_ms",
    "timeout_error",
)
