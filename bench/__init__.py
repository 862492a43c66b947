"""Benchmarks: ``python -m bench [scenario ...]`` prints a table and writes bench/results/*.json."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
from pathlib import Path
from types import FrameType

_LATER: list[Path] = []


def remove_at_exit(path: Path) -> None:
    """Remove the directory ``path`` when the bench process ends, not now.

    A stack's data directory holds up to a file per job (its log). On this machine's ext4 (no
    journal), an inode freed in the last half minute to five minutes is skipped when a new one
    is allocated, each skip a lookup (``recently_deleted``): a scenario run right after another
    deleted its 100,000 files spent up to a fifth of its workers' CPU creating log files
    (measured with perf). Removing the trees at the end keeps one scenario from taxing the next.
    With ``HS_BENCH_KEEP_FILES`` set, they are left for the caller (``bench.ab`` removes its
    runs' trees after the last run, for the same reason).
    """
    if os.environ.get("HS_BENCH_KEEP_FILES"):
        return
    if not _LATER:
        atexit.register(_remove_all)
    _LATER.append(path)


def _remove_all() -> None:
    for path in _LATER:
        shutil.rmtree(path, ignore_errors=True)
    _LATER.clear()


STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end a bench the way Ctrl-C does (``kill``, ``timeout``, a closed terminal)."""


def stop_on_signals() -> None:
    """Make SIGTERM and SIGHUP end this process as SystemExit (code 128 + the signal).

    A scenario takes its private stack down in a ``finally`` and removes its trees at exit,
    but Python's default for these signals ends the process at once, past both: a bench
    stopped by ``kill`` or ``timeout`` left its broker, MariaDB-backed services and workers
    running, each taxing every later run, and no ``make down`` sees them (each stack's state
    is in its own temporary directory). Raised in the main thread, the exit unwinds like
    Ctrl-C's KeyboardInterrupt.
    """
    def stop(signum: int, _frame: FrameType | None) -> None:
        sys.exit(128 + signum)

    for sig in STOPPING_SIGNALS:
        signal.signal(sig, stop)
