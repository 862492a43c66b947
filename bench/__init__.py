"""Benchmarks: ``python -m bench [scenario ...]`` prints a table and writes bench/results/*.json."""

from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path

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
