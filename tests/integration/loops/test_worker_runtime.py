"""The local container runtime against real processes: exits, logs, env, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.worker import runtime as runtime_module
from services.worker.runtime import (
    FileLogSink,
    LocalProcessRuntime,
    LocalRuntimeSettings,
    MemoryLogSink,
    Outcome,
    RunRequest,
    request_from_spec,
)
from services.worker.spawner import HELPER_NAME

pytestmark = pytest.mark.integration


def _clock() -> itertools.count[int]:
    return itertools.count(1_000, 10)


SPAWNERS = {"popen": None, "spawner": str(Path(sys.executable).parent / HELPER_NAME)}
"""How the runtime starts processes: Popen from the test's process, or the C helper that
``make venv`` builds (services/worker/spawner); every test here runs with both."""

_spawner: list[str | None] = [None]


@pytest.fixture(autouse=True, params=sorted(SPAWNERS))
def spawner(request: pytest.FixtureRequest) -> Iterator[str | None]:
    path = SPAWNERS[request.param]
    if path is not None:
        assert os.access(path, os.X_OK), f"{path} is not built: run make venv"
    _spawner[0] = path
    yield path
    _spawner[0] = None


def _runtime(kill_grace_s: float = 5.0) -> LocalProcessRuntime:
    ticks = _clock()
    return LocalProcessRuntime(
        LocalRuntimeSettings(kill_grace_s=kill_grace_s, spawner=_spawner[0]),
        clock=lambda: next(ticks))


SINKS = ["memory", "file"]
"""A sink without a file is fed through a pipe; a log file is the process's output itself."""


async def _run(command: list[str], tmp_path: Path, *, timeout_s: float | None = None,
               env: dict[str, str] | None = None, sink: str = "memory") -> tuple[Outcome, bytes]:
    request = RunRequest(command=command, cwd=str(tmp_path), timeout_s=timeout_s, env=env or {})
    if sink == "file":
        with FileLogSink(tmp_path / "logs", "main") as file_sink:
            outcome = await _runtime().run(request, file_sink)
        return outcome, (tmp_path / "logs" / "main.log").read_bytes()
    log = MemoryLogSink()
    outcome = await _runtime().run(request, log)
    return outcome, log.getvalue()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _gone(pid: int) -> bool:
    """Whether ``pid`` dies within a second (a killed process closes its files before it exits)."""
    for _ in range(50):
        if not _alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


def _same_file(a: str, b: Path) -> bool:
    return os.path.samefile(a, b)


def _read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def _wait_for_pids(path: Path, n: int) -> list[int]:
    for _ in range(200):
        pids = _read_pids(path)
        if len(pids) >= n:
            return pids[:n]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never listed {n} pids")


@pytest.mark.parametrize(("command", "state", "exit_code"), [
    (["true"], "Success", 0),
    (["false"], "Failed", 1),
    (["sh", "-c", "exit 3"], "Failed", 3),
    (["sh", "-c", "kill -TERM $$"], "Failed", 143),
    (["sh", "-c", "kill -KILL $$"], "Failed", 137),
], ids=["true", "false", "exit-3", "sigterm", "sigkill"])
async def test_exit_codes(tmp_path: Path, command: list[str], state: str,
                          exit_code: int) -> None:
    outcome, _ = await _run(command, tmp_path)
    assert (outcome.state, outcome.exit_code) == (state, exit_code)
    assert outcome.error is None and outcome.short_error is None and not outcome.timed_out
    assert outcome.start_time_ms == 1_000 and outcome.end_time_ms > outcome.start_time_ms


@pytest.mark.parametrize("sink", SINKS)
async def test_log_holds_stdout_and_stderr_in_order(tmp_path: Path, sink: str) -> None:
    outcome, log = await _run(
        ["sh", "-c", "echo hello; echo oops >&2; echo bye"], tmp_path, sink=sink)
    assert outcome.state == "Success"
    assert log == b"hello\noops\nbye\n"


async def test_env_on_top_of_a_minimal_environment(tmp_path: Path) -> None:
    os.environ["HS_TEST_LEAK"] = "leaked"
    try:
        outcome, log = await _run(["sh", "-c", 'echo "$FOO|$HS_TEST_LEAK|$PATH"'], tmp_path,
                                  env={"FOO": "bar baz"})
    finally:
        del os.environ["HS_TEST_LEAK"]
    assert outcome.state == "Success"
    foo, leak, path = log.decode().rstrip("\n").split("|")
    assert (foo, leak) == ("bar baz", "")
    assert "/usr/bin" in path


async def test_working_directory(tmp_path: Path) -> None:
    outcome, log = await _run(["pwd"], tmp_path)
    assert outcome.state == "Success"
    assert _same_file(log.decode().strip(), tmp_path)


@pytest.mark.parametrize(("command", "error", "short"), [
    (["no-such-executable-hs"],
     "executable file `no-such-executable-hs` not found in $PATH: No such file or directory",
     "executable not found"),
    (["/nonexistent/bin/tool"],
     "executable file `/nonexistent/bin/tool` not found: No such file or directory",
     "executable not found"),
    ([], "empty command", "empty command"),
], ids=["in-path", "absolute", "empty"])
@pytest.mark.parametrize("sink", SINKS)
async def test_cannot_start_is_an_error_outcome(tmp_path: Path, command: list[str], error: str,
                                                short: str, sink: str) -> None:
    outcome, log = await _run(command, tmp_path, sink=sink)
    assert outcome.state == "Error"
    assert outcome.exit_code is None
    assert (outcome.error, outcome.short_error) == (error, short)
    assert log == f"{error}\n".encode()


async def test_not_executable_is_an_error_outcome(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    outcome, _ = await _run([str(script)], tmp_path)
    assert (outcome.state, outcome.short_error) == ("Error", "permission denied")


@pytest.mark.parametrize("where", ["missing", "a-file"])
@pytest.mark.parametrize("command", [["true"], ["no-such-executable-here"]])
async def test_missing_working_directory_is_an_error_outcome(tmp_path: Path, where: str,
                                                             command: list[str]) -> None:
    # The directory is looked at only once a start failed (ENOENT or ENOTDIR, as for a missing
    # executable): its error, not the executable's, whichever of the two is missing.
    (tmp_path / "a-file").write_text("not a directory")
    cwd = tmp_path / where
    outcome, log = await _run(command, cwd)
    error = f"working directory `{cwd}` does not exist"
    assert (outcome.state, outcome.exit_code) == ("Error", None)
    assert (outcome.error, outcome.short_error) == (error, "no working directory")
    assert log == f"{error}\n".encode()


async def test_timeout_kills_and_reports_the_reference_error(tmp_path: Path) -> None:
    t0 = time.monotonic()
    outcome, _ = await _run(["sleep", "30"], tmp_path, timeout_s=1)
    assert time.monotonic() - t0 < 3
    assert outcome.state == "Error" and outcome.timed_out
    assert outcome.error == "ContainerTimeoutError: timed out after 1s"
    assert outcome.short_error == "timed out"
    assert outcome.exit_code == 143  # SIGTERM


async def test_many_concurrent_runs_each_report_their_own_exit(tmp_path: Path) -> None:
    """Exits are told apart per process (each run waits on its own pidfd)."""
    runtime = _runtime()
    outcomes = await asyncio.gather(*(runtime.run(
        RunRequest(command=["sh", "-c", f"exit {i % 7}"], cwd=str(tmp_path)), MemoryLogSink())
        for i in range(60)))
    assert [o.exit_code for o in outcomes] == [i % 7 for i in range(60)]


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    outcome, _ = await _run(
        ["sh", "-c", f"sleep 30 & echo $! > {pids}.tmp; echo $$ >> {pids}.tmp; "
                     f"mv {pids}.tmp {pids}; sleep 30"], tmp_path, timeout_s=1)
    assert time.monotonic() - t0 < 3
    assert outcome.timed_out
    child, shell = _read_pids(pids)
    assert await _gone(shell) and await _gone(child)


async def test_sigterm_ignored_gets_sigkill_after_grace(tmp_path: Path) -> None:
    runtime = _runtime(kill_grace_s=0.5)
    t0 = time.monotonic()
    outcome = await runtime.run(
        RunRequest(command=["sh", "-c", "trap '' TERM; sleep 30"], cwd=str(tmp_path),
                   timeout_s=0.5), MemoryLogSink())
    assert time.monotonic() - t0 < 3
    assert outcome.timed_out and outcome.exit_code == 137
    assert outcome.error == "ContainerTimeoutError: timed out after 0.5s"


@pytest.mark.parametrize("sink", SINKS)
async def test_leftover_background_process_dies_with_the_leader(tmp_path: Path,
                                                               sink: str) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    outcome, _ = await _run(["sh", "-c", f"sleep 30 & echo $! > {pids}; exit 0"], tmp_path,
                            sink=sink)
    assert time.monotonic() - t0 < 3  # the leftover held the log pipe open; it was killed
    assert outcome.state == "Success"
    assert await _gone(_read_pids(pids)[0])


@pytest.mark.parametrize("sink", SINKS)
async def test_cancel_kills_the_group_and_returns_cancelled(tmp_path: Path, sink: str) -> None:
    pids = tmp_path / "pids"
    log = MemoryLogSink() if sink == "memory" else FileLogSink(tmp_path / "logs", "main")
    request = RunRequest(
        command=["sh", "-c", f"sleep 30 & echo $! > {pids}.tmp; echo $$ >> {pids}.tmp; "
                             f"mv {pids}.tmp {pids}; echo started; sleep 30"],
        cwd=str(tmp_path))
    task = asyncio.create_task(_runtime().run(request, log))
    child, shell = await _wait_for_pids(pids, 2)
    t0 = time.monotonic()
    task.cancel()
    outcome = await task
    assert time.monotonic() - t0 < 3
    assert not task.cancelled() and task.cancelling() == 0
    assert outcome.state == "Cancelled" and outcome.exit_code == 143
    assert await _gone(shell) and await _gone(child)
    if isinstance(log, FileLogSink):
        log.close()
        assert log.path.read_bytes() == b"started\n"
    else:
        assert log.getvalue() == b"started\n"


async def test_cancel_inside_a_task_group_does_not_break_it(tmp_path: Path) -> None:
    outcomes: list[Outcome] = []

    async def run() -> None:
        outcomes.append(await _runtime().run(
            RunRequest(command=["sleep", "30"], cwd=str(tmp_path)), MemoryLogSink()))

    async with asyncio.TaskGroup() as group:
        task = group.create_task(run())
        await asyncio.sleep(0.2)
        task.cancel()
    assert [o.state for o in outcomes] == ["Cancelled"]


@pytest.mark.parametrize("sink", SINKS)
async def test_large_output_is_captured_whole(tmp_path: Path, sink: str) -> None:
    size = 5 * 1024 * 1024
    outcome, log = await _run(
        ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' 'x'; echo; echo end >&2"], tmp_path,
        sink=sink)
    assert outcome.state == "Success"
    assert len(log) == size + len(b"\nend\n")
    assert log.endswith(b"x\nend\n") and log.count(b"x") == size


async def test_file_sink_writes_under_a_directory(tmp_path: Path) -> None:
    with FileLogSink(tmp_path / "logs" / "job-1", "main") as sink:
        outcome = await _runtime().run(
            RunRequest(command=["sh", "-c", "echo hello; echo world >&2"], cwd=str(tmp_path)),
            sink)
    assert outcome.state == "Success"
    assert (tmp_path / "logs" / "job-1" / "main.log").read_bytes() == b"hello\nworld\n"


async def test_request_from_a_docker_job_spec(tmp_path: Path) -> None:
    spec = {
        "job_id": 1,
        "process": {"type": "docker", "image": "ubuntu:24.04",
                    "command": ["sh", "-c", 'echo "$FOO $HAIL_JOB_ID"']},
        "env": [{"name": "FOO", "value": "from-spec"}, {"name": "HAIL_JOB_ID", "value": "x"}],
        "timeout": 5,
    }
    request = request_from_spec(spec, cwd=tmp_path, extra_env={"HAIL_JOB_ID": "1"})
    assert (request.timeout_s, request.image) == (5, "ubuntu:24.04")
    log = MemoryLogSink()
    outcome = await _runtime().run(request, log)
    assert outcome.state == "Success"
    assert log.getvalue() == b"from-spec 1\n"


def test_request_from_a_jvm_spec_is_refused(tmp_path: Path) -> None:
    spec = {"job_id": 1, "process": {"type": "jvm", "command": [],
                                     "jar_spec": {"type": "jar_url", "value": "x"}}}
    with pytest.raises(ValueError, match="not a docker job"):
        request_from_spec(spec, cwd=tmp_path)


async def test_child_gets_default_signals_its_own_session_and_no_other_descriptor(
        tmp_path: Path) -> None:
    # Python ignores SIGPIPE and SIGXFSZ: a job must not inherit that; the job leads a new
    # session; the worker's descriptors (sockets, logs) are not the job's, inheritable or not.
    leaked = os.open(tmp_path, os.O_RDONLY)
    high = os.dup2(leaked, 250, inheritable=True)
    try:
        outcome, log = await _run(["sh", "-c", 'grep -E "^(SigIgn|SigBlk)" /proc/self/status; '
                                   'echo "session $(cut -d" " -f6 /proc/$$/stat) $$"; '
                                   'echo fds $(ls /proc/self/fd)'], tmp_path)
    finally:
        os.close(leaked)
        os.close(high)
    assert outcome.state == "Success"
    fields = {line.split()[0].rstrip(":"): line.split()[1:] for line in log.decode().splitlines()}
    ignored = int(fields["SigIgn"][0], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    assert int(fields["SigBlk"][0], 16) == 0
    assert fields["session"][0] == fields["session"][1]
    assert str(high) not in fields["fds"] and {"0", "1", "2"} <= set(fields["fds"])


async def test_path_is_the_jobs_not_the_workers(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    tool = tools / "hs-own-tool"
    tool.write_text("#!/bin/sh\necho found \"$0\"\n")
    tool.chmod(0o755)
    outcome, log = await _run(["hs-own-tool"], tmp_path, env={"PATH": f"/nowhere:{tools}"})
    assert outcome.state == "Success" and log == f"found {tool}\n".encode()
    missing, _ = await _run(["hs-own-tool"], tmp_path)
    assert missing.state == "Error" and missing.short_error == "executable not found"


async def test_relative_command_runs_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "here.sh").write_text("#!/bin/sh\necho here\n")
    (tmp_path / "here.sh").chmod(0o755)
    outcome, log = await _run(["./here.sh"], tmp_path)
    assert outcome.state == "Success" and log == b"here\n"


async def test_a_null_byte_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="null byte"):
        await _run(["echo", "a\0b"], tmp_path)



def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_stdin_is_empty_and_runs_leave_no_descriptor_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawner: str | None) -> None:
    """A job reads /dev/null; the worker holds no descriptor of a run once it ended (pidfds,
    pipes; the set that watches the pidfds once idle), whether runs overlap or follow one
    another. All it keeps is one descriptor of /dev/null, for every run of the process (with
    the spawner: the socket to it, one per event loop, instead; the helper's children get
    nothing of the helper's but their three standard descriptors)."""
    monkeypatch.setattr(runtime_module._Reaper, "IDLE_S", 0.05)
    before = _descriptors()
    kinds, most = ({"socket", "/dev/null"}, 2) if spawner else ({"/dev/null"}, 1)
    runtime = _runtime()
    outcome, log = await _run(["sh", "-c", "readlink /proc/self/fd/0; cat; echo read; "
                               "ls /proc/self/fd"], tmp_path)
    # fd 3 is the directory ls reads
    assert outcome.state == "Success" and log == b"/dev/null\nread\n0\n1\n2\n3\n"
    for _ in range(3):
        outcomes = await asyncio.gather(*(runtime.run(
            RunRequest(command=["sh", "-c", f"sleep 0.0{i % 5}; exit {i % 4}"],
                       cwd=str(tmp_path)), MemoryLogSink()) for i in range(40)))
        assert [o.exit_code for o in outcomes] == [i % 4 for i in range(40)]
        await asyncio.sleep(0.2)
        kept = _descriptors() - before
        assert {os.readlink(f"/proc/self/fd/{fd}").split(":")[0] for fd in kept} <= kinds
        assert len(kept) <= most


async def test_a_relative_path_entry_is_the_working_directorys(tmp_path: Path) -> None:
    """As execvp in the job's directory: ``bin`` in PATH is ``<cwd>/bin``, not the worker's."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "hs-relative-tool"
    tool.write_text("#!/bin/sh\necho relative\n")
    tool.chmod(0o755)
    outcome, log = await _run(["hs-relative-tool"], tmp_path, env={"PATH": "/nowhere:bin"})
    assert outcome.state == "Success" and log == b"relative\n"
