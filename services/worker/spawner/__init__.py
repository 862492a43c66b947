"""The worker's side of ``hs-spawner``: job processes started and reaped by a small C helper.

Starting a no-op job from the worker's Python cost more than the job itself: ``Popen``'s own
code, a ``vfork`` of a process the worker's size (its loop blocked until the child has exec'd),
a pidfd, its epoll registration and a ``waitpid``. The helper (``hs_spawner.c``, built by ``make
venv`` next to the venv's Python) starts each process with ``vfork`` and ``execve`` from a
process of a few hundred kilobytes, waits for all of them through one ``signalfd``, and tells
the worker over one ``SOCK_SEQPACKET`` socket: a start is one ``sendmsg`` (the job's output
descriptor travels with it); its answer and its end are 13 bytes each, sent with the other
replies of the same turn of the helper's loop in one packet and read by one loop reader (a
packet a reply and a read until the socket was empty cost the worker a fifth of its CPU a job,
measured). A job whose log is a local file need not send a descriptor: the helper reads its
output from a pipe into the file, made on the first byte (most short jobs write nothing, and a
file's creation was the largest single cost of a no-op job's worker).

One helper per event loop, started with the loop's first job and kept while the loop runs. If
it dies, the jobs it was running are killed and fail (their end could no longer be known) and
the next start starts a new one. Where it is not built, or with ``HS_WORKER_SPAWNER=off``, the
runtime starts processes with ``Popen`` as before (:func:`helper_path`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

HELPER_NAME = "hs-spawner"
HELPER_ENV = "HS_WORKER_SPAWNER"
"""The helper's path, or ``off`` for ``Popen``; unset: :data:`HELPER_NAME` beside the Python
that runs the worker, where ``make venv`` builds it."""

MAX_REQUEST = 64 * 1024
"""The largest start request sent (a packet must fit the socket's buffer, 208 KiB by default;
the helper reads up to 1 MiB). Linux execs up to 2 MiB of arguments and environment: a bigger
job starts with ``Popen``."""

_REPLY = struct.Struct("=cQi")
_REPLIES_MAX = 4096
"""The largest reply packet read: the helper sends at most 256 replies of 13 bytes a packet
(``MAX_REPLIES`` in ``hs_spawner.c``); a longer one would be cut, and is refused."""
_SPAWN = struct.Struct("=cQII")
_SPAWN_LOGGED = struct.Struct("=cQIII")
_FS_ENCODING = sys.getfilesystemencoding()  # what os.fsencode encodes with
_KILL = struct.Struct("=cQi")


def helper_path(env: Mapping[str, str] | None = None) -> str | None:
    """The helper to use, or None for ``Popen`` (switched off, or not built here)."""
    env = os.environ if env is None else env
    given = env.get(HELPER_ENV, "")
    if given == "off":
        return None
    path = given or str(Path(sys.executable).parent / HELPER_NAME)
    return path if os.access(path, os.X_OK) else None


class SpawnerGone(OSError):
    """The helper ended: what it was starting or watching is unknown."""


class HelperChild:
    """A process the helper starts: its pid once started, and a future of its return code (as
    Popen's: the exit code, or minus the signal that killed it), or of the OSError that kept it
    from starting (or :class:`SpawnerGone`)."""

    def __init__(self, spawner: Spawner, key: int, argv0: str,
                 exited: asyncio.Future[int]) -> None:
        self._spawner = spawner
        self._key = key
        self.argv0 = argv0
        self.pid: int | None = None
        self.exited = exited
        # True: its working directory was empty when it ended (the helper looks, for a start
        # with a log file); None: not known.
        self.workdir_empty: bool | None = None

    @property
    def returncode(self) -> int | None:
        if self.exited.done() and not self.exited.cancelled() and self.exited.exception() is None:
            return self.exited.result()
        return None

    async def wait(self) -> int:
        """The return code once the process ended; cancelling the wait leaves it running.
        OSError if it never started."""
        return await asyncio.shield(self.exited)

    def signal_group(self, sig: int) -> None:
        """Signal the process group through the helper, which does so only while it has not
        reaped the leader (a pid it reaped may be reused). Sent before its start is answered,
        it still comes after the start: the helper reads its socket in order."""
        self._spawner.signal_group(self._key, sig)

    def sweep(self) -> None:
        """Kill whatever is left in the process group: the helper did so when it reaped the
        leader (no pid of it could be reused yet); before that, through the helper."""
        if not self.exited.done():
            self.signal_group(signal.SIGKILL)


class Spawner:
    """One helper process and the jobs it started, for one event loop."""

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Spawner] = (
        weakref.WeakKeyDictionary())
    _open: set[Spawner] = set()  # until closed: a helper is waited for, never just dropped

    _last: Spawner | None = None  # the one asked for last: a worker runs on one loop

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop, path: str) -> Spawner:
        spawner = cls._last
        if spawner is not None and spawner._loop is loop and not spawner._closed:
            return spawner  # without the weak dictionary's lookup, once per job
        spawner = cls._by_loop.get(loop)
        if spawner is None or spawner._closed:
            spawner = cls._by_loop[loop] = cls(loop, path)
        cls._last = spawner
        return spawner

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        self._loop = loop
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # Nothing of the worker's environment (it may hold credentials): each job gets
            # the environment its start request gives.
            self._proc = subprocess.Popen(
                [path, str(theirs.fileno())], pass_fds=[theirs.fileno()], env={},
                stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.setblocking(False)
        self._sock = mine
        self._closed = False
        self._next = 0
        self._children: dict[int, HelperChild] = {}  # started or starting, by key
        self._outgoing: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        loop.add_reader(mine.fileno(), self._on_readable)
        self._open.add(self)

    @classmethod
    def close_all(cls) -> None:
        """End every helper (as :meth:`close`): for a process that stops running jobs, and for
        tests, whose event loops come and go."""
        for spawner in list(cls._open):
            spawner.close()

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str,
              out_fd: int | None = None, *, log_path: str | None = None,
              drain_s: float = 5.0) -> HelperChild | None:
        """Have ``argv`` started in ``cwd`` with ``env``, and with ``out_fd`` as its stdout and
        stderr (the helper holds its own copy once this returns), or with its output written
        to the file ``log_path``, which the helper makes (and its directories) on the first
        byte: its end is told once its output is all there, or ``drain_s`` after it ended if
        something it left outside its group holds its output open. The child's ``exited``
        says how it ended, or holds the OSError its exec raised. None for a command and
        environment too big for one packet (:data:`MAX_REQUEST`): start that one some other
        way."""
        if self._closed:
            raise SpawnerGone(errno.EPIPE, "the process spawner has ended")
        if (out_fd is None) == (log_path is None):
            raise ValueError("give exactly one of out_fd and log_path")
        self._next += 1
        key = self._next
        strings = [cwd, *argv, *[f"{k}={v}" for k, v in env.items()]]
        if log_path is not None:
            strings.insert(0, log_path)
        # One string, encoded once as os.fsencode encodes each (1.1 us a job less than a
        # pass per string): a null byte inside one shows as a separator too many.
        text = "\0".join(strings)
        if text.count("\0") != len(strings) - 1:
            raise ValueError("embedded null byte")  # as Popen says it
        header = (_SPAWN.pack(b"S", key, len(argv), len(env)) if out_fd is not None else
                  _SPAWN_LOGGED.pack(b"L", key, len(argv), len(env),
                                     min(int(drain_s * 1000), 2**32 - 1)))
        payload = b"".join((header, text.encode(_FS_ENCODING, "surrogateescape"), b"\0"))
        if len(payload) > MAX_REQUEST:
            return None
        child = HelperChild(self, key, argv[0], self._loop.create_future())
        self._children[key] = child
        self._send(payload, [] if out_fd is None else [out_fd])
        return child

    def signal_group(self, key: int, sig: int) -> None:
        if not self._closed and key in self._children:
            self._send(_KILL.pack(b"K", key, sig), [])

    # --- the socket ---------------------------------------------------------------------------
    def _send(self, payload: bytes, fds: list[int]) -> None:
        if not self._outgoing:
            try:
                if fds:
                    socket.send_fds(self._sock, [payload], fds)
                else:  # a plain send: 1.1 us less than send_fds without descriptors
                    self._sock.send(payload)
                return
            except BlockingIOError:
                pass
            except OSError as e:
                self._gone(e)
                return
            # The helper is behind: keep the descriptors until they are sent.
            self._loop.add_writer(self._sock.fileno(), self._flush)
        self._outgoing.append((payload, [os.dup(fd) for fd in fds]))

    def _flush(self) -> None:
        while self._outgoing:
            payload, fds = self._outgoing[0]
            try:
                if fds:
                    socket.send_fds(self._sock, [payload], fds)
                else:
                    self._sock.send(payload)
            except BlockingIOError:
                return
            except OSError as e:
                self._gone(e)
                return
            self._outgoing.popleft()
            for fd in fds:
                os.close(fd)
        self._loop.remove_writer(self._sock.fileno())

    def _on_readable(self) -> None:
        # One packet a call: the loop calls again while the socket has more. A packet holds
        # the replies of one turn of the helper's loop (its starts and ends together), and
        # reading until the socket was empty cost every wakeup a raised BlockingIOError.
        try:
            data = self._sock.recv(_REPLIES_MAX)
        except BlockingIOError:
            return
        except OSError as e:
            self._gone(e)
            return
        if not data:
            self._gone(None)
            return
        if len(data) % _REPLY.size:
            self._gone(OSError(errno.EPROTO, f"a reply packet of {len(data)} bytes"))
            return
        children = self._children
        for kind, key, value in _REPLY.iter_unpack(data):
            if kind == b"P":
                children[key].pid = value
                continue
            child = children.pop(key)
            if kind == b"X" or kind == b"Y":
                if kind == b"Y":
                    child.workdir_empty = True
                child.exited.set_result(os.waitstatus_to_exitcode(value))
            else:
                child.exited.set_exception(OSError(value, os.strerror(value), child.argv0))

    def _gone(self, error: BaseException | None, *, closing: bool = False) -> None:
        """The helper ended (or its socket failed): fail what it was doing, and stop."""
        if self._closed:
            return
        self._closed = True
        self._open.discard(self)
        if self._by_loop.get(self._loop) is self:
            del self._by_loop[self._loop]
        code = self._proc.poll()
        if self._children or not closing:
            log.error("the process spawner ended (exit code %s, %s): %d jobs lost", code,
                      error, len(self._children))
        for child in self._children.values():
            if child.pid is not None:  # nobody could tell of its end: it must not outlive this
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, signal.SIGKILL)
            child.exited.set_exception(SpawnerGone(
                errno.EPIPE, f"the process spawner ended (exit code {code}) while the job ran; "
                "its processes were killed", child.argv0))
        self._children.clear()
        if not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
            if self._outgoing:
                self._loop.remove_writer(self._sock.fileno())
        for _, fds in self._outgoing:
            for fd in fds:
                os.close(fd)
        self._outgoing.clear()
        self._sock.close()
        try:
            self._proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        """End the helper; jobs it still runs are killed and fail (:class:`SpawnerGone`)."""
        self._gone(None, closing=True)
