"""The job-process spawner (services/worker/spawner) beyond what every runtime test runs it
through: its end, a cancel before it answered, a full socket, and where it is found."""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import signal
import sys
from pathlib import Path

import pytest

from services.worker.runtime import (
    FileLogSink,
    LocalProcessRuntime,
    LocalRuntimeSettings,
    MemoryLogSink,
    RunRequest,
)
from services.worker.spawner import HELPER_ENV, HELPER_NAME, Spawner, helper_path

pytestmark = pytest.mark.integration

HELPER = str(Path(sys.executable).parent / HELPER_NAME)


@pytest.fixture(autouse=True)
def built() -> None:
    assert os.access(HELPER, os.X_OK), f"{HELPER} is not built: run make venv"


def _runtime(drain_timeout_s: float = 5.0) -> LocalProcessRuntime:
    return LocalProcessRuntime(LocalRuntimeSettings(spawner=HELPER, kill_grace_s=1.0,
                                                    drain_timeout_s=drain_timeout_s))


def _spawner() -> Spawner:
    return Spawner.for_loop(asyncio.get_running_loop(), HELPER)


async def test_a_spawner_that_ends_fails_its_jobs_and_the_next_run_starts_another(
        tmp_path: Path) -> None:
    runtime = _runtime()
    running = asyncio.create_task(runtime.run(
        RunRequest(command=["sleep", "30"], cwd=str(tmp_path)), MemoryLogSink()))
    spawner = _spawner()
    for _ in range(500):  # until the spawner says it started
        if any(c.pid for c in spawner._children.values()):
            break
        await asyncio.sleep(0.01)
    [child] = spawner._children.values()
    assert child.pid is not None
    os.kill(spawner._proc.pid, signal.SIGKILL)
    outcome = await asyncio.wait_for(running, 10)
    assert outcome.state == "Error" and outcome.short_error == "worker error"
    assert outcome.error is not None and "the process spawner ended" in outcome.error
    with pytest.raises(ProcessLookupError):  # killed, not left behind unwatched
        for _ in range(100):
            os.killpg(child.pid, 0)
            await asyncio.sleep(0.02)
    again = await runtime.run(RunRequest(command=["sh", "-c", "exit 3"], cwd=str(tmp_path)),
                              MemoryLogSink())
    assert again.state == "Failed" and again.exit_code == 3
    assert _spawner() is not spawner


async def test_a_cancel_before_the_start_is_answered_still_kills_the_process(
        tmp_path: Path) -> None:
    runtime = _runtime()
    spawner = _spawner()
    os.kill(spawner._proc.pid, signal.SIGSTOP)  # the start waits in the socket, unanswered
    try:
        running = asyncio.create_task(runtime.run(
            RunRequest(command=["sleep", "30"], cwd=str(tmp_path)), MemoryLogSink()))
        await asyncio.sleep(0.05)
        [child] = spawner._children.values()
        assert child.pid is None
        running.cancel()
        await asyncio.sleep(0.05)
    finally:
        os.kill(spawner._proc.pid, signal.SIGCONT)
    outcome = await asyncio.wait_for(running, 10)
    assert outcome.state == "Cancelled"
    # The kill went after the start: the spawner reaped the process, and knows of no other.
    assert child.exited.done() and child.returncode == -signal.SIGTERM
    assert spawner._children == {}


async def test_starts_wait_in_the_worker_while_the_spawners_socket_is_full(
        tmp_path: Path) -> None:
    runtime = _runtime()
    spawner = _spawner()
    os.kill(spawner._proc.pid, signal.SIGSTOP)
    try:
        runs = [asyncio.create_task(runtime.run(
            RunRequest(command=["sh", "-c", f"exit {i % 7}"], cwd=str(tmp_path)),
            MemoryLogSink())) for i in range(1_500)]
        # Some do not fit in the socket once enough have run their way to it: a fixed wait
        # was too short on a busy machine (a CI run found none waiting after 0.2 s).
        for _ in range(400):  # up to 20 s
            if spawner._outgoing:
                break
            await asyncio.sleep(0.05)
        assert spawner._outgoing
    finally:
        os.kill(spawner._proc.pid, signal.SIGCONT)
    outcomes = await asyncio.wait_for(asyncio.gather(*runs), 120)
    assert [o.exit_code for o in outcomes] == [i % 7 for i in range(1_500)]
    assert not spawner._outgoing and spawner._children == {}


def test_the_spawner_is_found_beside_python_unless_switched_off(tmp_path: Path) -> None:
    assert helper_path({}) == HELPER
    assert helper_path({HELPER_ENV: "off"}) is None
    assert helper_path({HELPER_ENV: str(tmp_path / "missing")}) is None
    other = tmp_path / "spawner"
    other.write_bytes(Path(HELPER).read_bytes())
    other.chmod(0o755)
    assert helper_path({HELPER_ENV: str(other)}) == str(other)
    assert LocalRuntimeSettings().spawner == helper_path()


async def test_a_job_too_big_for_one_request_starts_without_the_spawner(tmp_path: Path) -> None:
    """Linux execs up to 2 MiB of arguments and environment (128 KiB a string); one request
    to the spawner holds up to 64 KiB."""
    big = "x" * 100_000  # a single string may be at most 128 KiB
    outcome_log = MemoryLogSink()
    outcome = await _runtime().run(RunRequest(
        command=["sh", "-c", 'echo ${#BIG} "$0" $$ $PPID', "argument"], env={"BIG": big},
        cwd=str(tmp_path)), outcome_log)
    assert outcome.state == "Success"
    length, arg0, _, parent = outcome_log.getvalue().decode().split()
    assert (length, arg0) == ("100000", "argument")
    assert int(parent) == os.getpid()  # started here, not by the spawner
    small = MemoryLogSink()
    await _runtime().run(RunRequest(command=["sh", "-c", "echo $PPID"], cwd=str(tmp_path)), small)
    assert int(small.getvalue()) == _spawner()._proc.pid


async def test_the_spawner_gets_nothing_of_the_workers_environment(tmp_path: Path) -> None:
    """The worker's environment may hold credentials; a job gets only what its request says."""
    outcome = await _runtime().run(RunRequest(command=["true"], cwd=str(tmp_path)),
                                   MemoryLogSink())
    assert outcome.state == "Success"
    assert _environ(_spawner()._proc.pid) == b""


def _children(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


async def test_the_spawner_kills_the_group_when_it_reaps_its_leader(tmp_path: Path) -> None:
    """Nothing of the worker's needed: by the time the worker hears of the end, the group is
    gone (a pid the spawner reaped could otherwise be reused before the worker's own kill)."""
    out = tmp_path / "out"
    fd = _create(out)
    try:
        child = _spawner().start(["sh", "-c", "sleep 30 & echo $!"], {"PATH": "/usr/bin:/bin"},
                                 str(tmp_path), fd)
    finally:
        os.close(fd)
    assert child is not None
    assert await asyncio.wait_for(child.wait(), 10) == 0
    left = int(_read(out))
    for _ in range(100):  # SIGKILL is sent; the kernel takes a moment to end it
        if not _alive(left):
            break
        await asyncio.sleep(0.01)
    assert not _alive(left)


def _create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_arguments_and_environment_reach_the_job_byte_for_byte(tmp_path: Path) -> None:
    # Encoded as os.fsencode encodes each string: UTF-8, undecodable bytes (surrogate escapes)
    # given back as they were.
    raw = b"caf\xc3\xa9 \xff\xfe end"
    value = os.fsdecode(raw)
    log = MemoryLogSink()
    outcome = await _runtime().run(RunRequest(
        command=["sh", "-c", 'printf "%s|%s" "$1" "$SPECIAL"', "sh", value],
        env={"SPECIAL": value}, cwd=str(tmp_path)), log)
    assert (outcome.state, outcome.exit_code) == ("Success", 0)
    assert log.getvalue() == raw + b"|" + raw


@pytest.mark.parametrize(("argv", "env"), [(["true", "a\0b"], {}), (["true"], {"A": "x\0y"}),
                                           (["true"], {"A\0B": "x"})])
async def test_a_null_byte_in_an_argument_or_the_environment_is_refused(
        tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
    read_fd, write_fd = os.pipe()
    try:
        spawner = _spawner()
        with pytest.raises(ValueError, match="embedded null byte"):
            spawner.start(argv, env, str(tmp_path), write_fd)
        assert spawner._children == {}  # nothing was sent
    finally:
        os.close(read_fd)
        os.close(write_fd)


# Logs the spawner writes: the file made on the first byte.

async def _logged(tmp_path: Path, script: str, *, timeout_s: float | None = None,
                  drain_timeout_s: float = 5.0, log: Path | None = None
                  ) -> tuple[str, int | None, Path]:
    log = log or tmp_path / "logs" / "7" / "1+a1+main.log"  # directories not made yet
    sink = FileLogSink.lazy(str(log))
    try:
        outcome = await _runtime(drain_timeout_s).run(RunRequest(
            command=["sh", "-c", script], cwd=str(tmp_path), timeout_s=timeout_s), sink)
    finally:
        sink.close()
    return outcome.state, outcome.exit_code, log


async def test_the_spawner_makes_a_jobs_log_file_on_its_first_byte(tmp_path: Path) -> None:
    script = "printf out; printf err >&2; head -c 200000 /dev/zero | tr '\\0' x; exit 4"
    state, code, log = await _logged(tmp_path, script)
    assert (state, code) == ("Failed", 4)
    # In write order, stdout and stderr alike, more than one pipe's worth, all there by the end.
    assert log.read_bytes() == b"outerr" + b"x" * 200000


async def test_a_job_that_writes_nothing_leaves_no_file_and_no_stale_one(
        tmp_path: Path) -> None:
    state, code, log = await _logged(tmp_path, "exit 0")
    assert (state, code) == ("Success", 0) and not log.exists()
    assert not (tmp_path / "logs").exists()
    log.parent.mkdir(parents=True)
    log.write_bytes(b"an earlier run of this attempt\n")
    state, code, _ = await _logged(tmp_path, "true")
    assert state == "Success" and not log.exists()


@pytest.mark.parametrize(("script", "empty"), [
    ("true", True),
    ("exit 3", True),
    ("touch left-behind", False),
    ("mkdir sub", False),
    ("touch x; rm x", True),
    ("rmdir \"$PWD\"", None),  # nothing to look into
])
async def test_the_spawner_says_whether_a_job_left_its_working_directory_empty(
        tmp_path: Path, script: str, empty: bool | None) -> None:
    """The worker reuses a working directory the spawner saw empty at the job's end without
    looking again; any other (not empty, gone) it looks at itself."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    sink = FileLogSink.lazy(str(tmp_path / "logs" / "main.log"))
    try:
        outcome = await _runtime().run(RunRequest(command=["sh", "-c", script],
                                                  cwd=str(workdir)), sink)
    finally:
        sink.close()
    assert outcome.state in ("Success", "Failed")
    assert outcome.workdir_empty is (True if empty else None)
    if empty is not None:
        assert (next(workdir.iterdir(), None) is None) is empty
    # Without the spawner nothing looks.
    popen = LocalProcessRuntime(LocalRuntimeSettings(spawner=None))
    workdir.mkdir(exist_ok=True)
    with FileLogSink.lazy(str(tmp_path / "logs" / "popen.log")) as popen_sink:
        outcome = await popen.run(RunRequest(command=["true"], cwd=str(workdir)), popen_sink)
    assert outcome.state == "Success" and outcome.workdir_empty is None


async def test_a_log_that_cannot_be_made_drops_the_output_not_the_job(tmp_path: Path) -> None:
    (tmp_path / "logs").write_bytes(b"")  # a file where the directory should be
    state, code, log = await _logged(tmp_path, "echo lost; exit 2")
    assert (state, code) == ("Failed", 2) and not log.exists()


async def test_output_held_open_outside_the_group_ends_the_job_after_the_drain_time(
        tmp_path: Path) -> None:
    """A process that left the job's session keeps the pipe open: the job ends drain_timeout_s
    after its leader, with the output written until then."""
    pid_file = tmp_path / "escaped"
    loop = asyncio.get_running_loop()
    began = loop.time()
    state, code, log = await _logged(
        tmp_path, f"setsid sh -c 'echo $$ > {pid_file}.new; mv {pid_file}.new {pid_file}; "
        f"exec sleep 30' & while [ ! -e {pid_file} ]; do sleep 0.01; done; echo hi",
        drain_timeout_s=0.5)
    took = loop.time() - began
    try:
        assert (state, code) == ("Success", 0)
        assert 0.45 <= took < 5
        assert log.read_bytes() == b"hi\n"
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_a_timed_out_job_keeps_the_output_it_wrote(tmp_path: Path) -> None:
    state, _, log = await _logged(tmp_path, "echo before; exec sleep 30", timeout_s=0.3)
    assert state == "Error" and log.read_bytes() == b"before\n"


async def test_a_command_that_is_not_there_says_so_in_its_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "1+a1+main.log"
    sink = FileLogSink.lazy(str(log))
    outcome = await _runtime().run(RunRequest(command=["no-such-command"], cwd=str(tmp_path)),
                                   sink)
    sink.close()
    assert outcome.state == "Error"
    assert outcome.error is not None and "no-such-command" in outcome.error
    assert log.read_text() == outcome.error + "\n"


async def test_many_jobs_at_once_each_get_their_own_output(tmp_path: Path) -> None:
    """Starts interleaved with ends and reads: a pipe the spawner is done with is never read
    again, even while a process being started still holds a copy of it."""
    async def one(i: int) -> None:
        log = tmp_path / "logs" / f"{i}+a1+main.log"
        script = f"echo {i}" if i % 2 else "true"
        state, code, _ = await _logged(tmp_path, script, log=log)
        assert (state, code) == ("Success", 0)
        assert (log.read_bytes() == f"{i}\n".encode()) if i % 2 else not log.exists()

    for round in range(60):  # small groups: an end read while the next starts are fresh
        await asyncio.gather(*(one(i) for i in range(round * 4, round * 4 + 4)))
    await asyncio.gather(*(one(i) for i in range(1000, 1200)))
    assert _spawner()._proc.returncode is None  # the spawner lived through it


async def test_without_the_spawner_a_lazy_log_is_made_by_the_worker(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "1+a1+main.log"
    sink = FileLogSink.lazy(str(log))
    runtime = LocalProcessRuntime(LocalRuntimeSettings(spawner=None))
    outcome = await runtime.run(RunRequest(command=["sh", "-c", "echo popen"],
                                           cwd=str(tmp_path)), sink)
    sink.close()
    assert outcome.state == "Success" and log.read_bytes() == b"popen\n"


def test_the_helper_sends_the_replies_of_one_turn_in_one_packet(tmp_path: Path) -> None:
    """Starts that arrive together are answered together: a packet of 13-byte replies, each
    start's 'P' before its 'X', and every reply once."""
    import socket
    import struct
    import subprocess

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    helper = subprocess.Popen([HELPER, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                              env={}, start_new_session=True)
    theirs.close()
    n = 40
    try:
        os.kill(helper.pid, signal.SIGSTOP)  # the starts queue in the socket
        with open(os.devnull, "wb") as out:
            for key in range(1, n + 1):
                strings = [str(tmp_path), "sh", "-c", f"exit {key % 5}", "PATH=/usr/bin:/bin"]
                payload = (struct.pack("=cQII", b"S", key, 3, 1)
                           + "\0".join(strings).encode() + b"\0")
                socket.send_fds(mine, [payload], [out.fileno()])
        os.kill(helper.pid, signal.SIGCONT)
        mine.settimeout(30)
        packets: list[bytes] = []
        replies: list[tuple[bytes, int, int]] = []
        while len(replies) < 2 * n:
            data = mine.recv(4096)
            assert data and len(data) % 13 == 0, data
            packets.append(data)
            replies += struct.iter_unpack("=cQi", data)
    finally:
        mine.close()
        helper.wait(timeout=10)
    assert len(packets) < len(replies)  # some packet held several
    assert sorted(key for kind, key, _ in replies if kind == b"P") == list(range(1, n + 1))
    ends = {key: os.waitstatus_to_exitcode(status) for kind, key, status in replies
            if kind == b"X"}
    assert ends == {key: key % 5 for key in range(1, n + 1)}
    order = [(kind, key) for kind, key, _ in replies]
    assert all(order.index((b"P", key)) < order.index((b"X", key)) for key in ends)


async def test_a_reply_packet_of_the_wrong_size_ends_the_spawner(tmp_path: Path) -> None:
    """A packet that is not whole replies (a cut one, or a helper of another build) fails what
    the spawner was running instead of being read as something else."""
    fake = tmp_path / "fake-helper"
    fake.write_text(f"#!{sys.executable}\n"
                    "import socket, sys, time\n"
                    "s = socket.socket(fileno=int(sys.argv[1]))\n"
                    "socket.recv_fds(s, 1 << 20, 4)\n"
                    "s.send(b'P' + bytes(13))\n"  # 14 bytes
                    "time.sleep(30)\n")
    fake.chmod(0o755)
    spawner = Spawner(asyncio.get_running_loop(), str(fake))
    out = os.open(os.devnull, os.O_WRONLY)
    try:
        child = spawner.start(["true"], {}, str(tmp_path), out)
    finally:
        os.close(out)
    assert child is not None
    with pytest.raises(OSError, match="the process spawner ended"):
        await asyncio.wait_for(child.wait(), 10)
    assert spawner._closed and spawner._children == {}


class _KernelSigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("flags", ctypes.c_ulong),
                ("restorer", ctypes.c_void_p), ("mask", ctypes.c_uint64)]


_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}.get(platform.machine())


def _ignore_raw(sig: int) -> _KernelSigaction:
    """Ignore ``sig`` by the system call (Python, like glibc, refuses glibc's own signals, 32
    and 33); what it was before, for :func:`_restore_raw`."""
    assert _RT_SIGACTION is not None, f"rt_sigaction's number on {platform.machine()}?"
    libc = ctypes.CDLL(None, use_errno=True)
    new, old = _KernelSigaction(handler=1), _KernelSigaction()  # 1: SIG_IGN
    assert libc.syscall(_RT_SIGACTION, sig, ctypes.byref(new), ctypes.byref(old), 8) == 0
    return old


def _restore_raw(sig: int, old: _KernelSigaction) -> None:
    assert _RT_SIGACTION is not None
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(_RT_SIGACTION, sig, ctypes.byref(old), None, 8) == 0


async def test_a_job_inherits_no_ignored_signal_from_the_worker(tmp_path: Path) -> None:
    """The helper resets every disposition at its start (its children rely on that, as they no
    longer reset each signal themselves): a worker that ignores SIGHUP (nohup), SIGINT or even
    glibc's own signal 32 (CI once ran the tests so) does not pass that on through the helper,
    as Popen's restore_signals would."""
    Spawner.close_all()  # a helper of this test's own, started while these are ignored
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGHUP, signal.SIGINT)}
    glibc_own = _ignore_raw(32)
    try:
        runtime = _runtime()
        outcome = await runtime.run(RunRequest(
            command=["sh", "-c", 'grep -E "^(SigIgn|SigBlk)" /proc/self/status'],
            cwd=str(tmp_path)), sink := MemoryLogSink())
    finally:
        _restore_raw(32, glibc_own)
        for s, handler in previous.items():
            signal.signal(s, handler)
        Spawner.close_all()
    assert outcome.state == "Success", outcome
    fields = dict(line.split(":") for line in sink.getvalue().decode().splitlines())
    assert int(fields["SigIgn"], 16) == 0 and int(fields["SigBlk"], 16) == 0


async def test_an_exec_that_fails_in_the_child_is_an_error_and_leaves_no_zombie(
        tmp_path: Path) -> None:
    """The file is there and executable, so the helper's own look up finds it; the kernel
    refuses to run it (ENOEXEC) only in the child, after vfork."""
    bad = tmp_path / "not-a-program"
    bad.write_bytes(b"\x7fELF but not really")
    bad.chmod(0o755)
    sink = MemoryLogSink()
    outcome = await _runtime().run(RunRequest(command=[str(bad)], cwd=str(tmp_path)), sink)
    assert outcome.state == "Error"
    assert outcome.error is not None and "Exec format error" in outcome.error, outcome.error
    helper = _spawner()._proc.pid
    assert _children(helper) == []
    again = await _runtime().run(RunRequest(command=["true"], cwd=str(tmp_path)),
                                 MemoryLogSink())
    assert again.state == "Success"  # the helper carries on
