"""Which code a bench ran and when, written into its JSON beside the machine's speed.

A figure is only worth comparing with another when both say what produced them: the commit,
whether the working tree differed from it (an uncommitted change measured is not the commit),
when the run started, and how it was asked for. bench/results/ is not tracked, so none of this
is known from the file afterwards unless the run writes it down.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

_GIT_TIMEOUT_S = 10.0


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version(repo: Path) -> dict[str, str | bool | None]:
    """The commit checked out in ``repo`` and whether tracked files differ from it (untracked
    files do not count: results and scratch files land there). None for both outside a git
    checkout or without git."""
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return {"commit": head.strip(), "dirty": None if status is None else bool(status.strip())}


def run_info(repo: Path, argv: Sequence[str], started: float) -> dict[str, object]:
    """What the JSON says about the run itself: the code, the start (UTC) and the arguments."""
    return {**code_version(repo),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "argv": list(argv)}
