"""Audit end to end (named to run after the other e2e modules): the compatibility scenarios of the
official client on a running system, then ``python -m services.audit rebuild`` replays the log
into a fresh database and finds no difference with the live projections.

The scheduler keeps running during the rebuild: the rebuild compares at the live snapshot's
offsets, so events that arrive meanwhile (heartbeats, late completions) cannot cause a false
difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from .conftest import REPO, System

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

INGEST_ONLY = ("create_fast_dependency", "groups", "token_idempotent", "errors",
               "billing_member", "billing_developer", "queries")
EXECUTION = ("run_basic", "dag", "cancel", "n_failures", "job_groups_run")


def audit(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.audit", *args],
                          env={**os.environ, **system.env}, cwd=REPO, capture_output=True,
                          text=True, timeout=180)


def run(system: System, scenario: str) -> Any:
    return system.hail(scenario, developer=scenario == "billing_developer")


def test_a_rebuild_after_the_compatibility_scenarios_has_no_difference(
        running_system: System) -> None:
    # Scenarios are independent (own batches); two at a time keeps the machine responsive.
    with ThreadPoolExecutor(max_workers=2) as pool:
        ingest_only = dict(zip(INGEST_ONLY, pool.map(lambda s: run(running_system, s),
                                                     INGEST_ONLY), strict=True))
        executed = dict(zip(EXECUTION, pool.map(lambda s: run(running_system, s), EXECUTION),
                            strict=True))
    assert ingest_only["token_idempotent"]["n_jobs"] == 1
    assert all(r["batch"]["complete"] for r in executed.values())
    assert executed["dag"]["states"]["child"] == "Cancelled"

    batch = executed["run_basic"]["batch"]["id"]
    history = audit(running_system, "history", "--batch", str(batch), "--json")
    assert history.returncode == 0, history.stderr
    lines = [json.loads(line) for line in history.stdout.splitlines()]
    tags = [line["tag"] for line in lines]
    mjcs = sum(len(line["event"]["attempts"]) if line["tag"] == "jobs.completed"
               else line["tag"] == "job.completed" for line in lines)
    assert tags[0] == "batch.created" and mjcs >= 5
    assert {"jobs.scheduled", "job.started", "batch.update_committed"} <= set(tags)

    rebuilt = audit(running_system, "rebuild", "--wait-s", "60")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert rebuilt.stdout == ""
    assert "0 differences" in rebuilt.stderr
