"""The bench's JSON says which commit it ran and whether the tree differed from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.provenance import code_version, run_info


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    return repo


def test_a_clean_checkout_gives_its_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    assert code_version(repo) == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}


def test_a_changed_tracked_file_makes_it_dirty_and_an_untracked_one_does_not(
        tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "results.json").write_text("{}\n")
    assert code_version(repo)["dirty"] is False
    (repo / "a.py").write_text("x = 2\n")
    assert code_version(repo)["dirty"] is True


def test_outside_a_checkout_both_are_unknown(tmp_path: Path) -> None:
    assert code_version(tmp_path) == {"commit": None, "dirty": None}


def test_the_run_says_when_it_started_in_utc_and_how_it_was_asked_for(tmp_path: Path) -> None:
    info = run_info(tmp_path, ["ingest", "--submit-only"], started=86_400.0 + 3_661.0)
    assert info["started_utc"] == "1970-01-02T01:01:01Z"
    assert info["argv"] == ["ingest", "--submit-only"]
