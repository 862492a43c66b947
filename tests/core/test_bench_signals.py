"""A bench stopped by a signal unwinds as on Ctrl-C: its ``finally`` blocks and exit hooks run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import STOPPING_SIGNALS

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import atexit, sys, time
from pathlib import Path
import bench
out = Path(sys.argv[1])
atexit.register(lambda: out.with_suffix(".atexit").write_text("ran"))
bench.stop_on_signals()
try:
    print("ready", flush=True)
    time.sleep(60)
finally:
    out.write_text("stack down")
"""


@pytest.mark.parametrize("sig", STOPPING_SIGNALS)
def test_a_signal_runs_the_finally_and_the_exit_hooks(tmp_path: Path,
                                                       sig: signal.Signals) -> None:
    out = tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 128 + sig
    assert out.read_text() == "stack down"
    assert out.with_suffix(".atexit").read_text() == "ran"


def test_without_it_a_signal_skips_both(tmp_path: Path) -> None:
    # What the handler is for: Python's default for SIGTERM ends the process past both.
    out = tmp_path / "done"
    script = _SCRIPT.replace("bench.stop_on_signals()", "")
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == -signal.SIGTERM
    assert not out.exists()
    assert not out.with_suffix(".atexit").exists()
