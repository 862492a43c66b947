"""Scheduler failover: the active replica is SIGKILLed mid-batch; the hot standby takes the
lease, publishes a newer epoch and finishes the batch, and no job has two attempts at once."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest

from services.common.settings import DatabaseSettings

from .conftest import SCHEDULER_ENV, System, get_json, start_system, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_schedulers(broker: str, migrated_db: DatabaseSettings,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    env = {**SCHEDULER_ENV, "HS_SCHEDULER_MAX_INSTANCES": "1"}
    for system in start_system(broker, migrated_db, tmp_path_factory.mktemp("failover"),
                               scheduler_env=env):
        system.scheduler_env = env
        yield system


def test_standby_finishes_the_batch_after_the_leader_is_killed(two_schedulers: System) -> None:
    system = two_schedulers
    standby = system.start_scheduler("scheduler-b", system.scheduler_env)
    batch_id = system.hail("submit_sleepers", "160", "1")["id"]
    # Mid-batch: some jobs done, others running, most still waiting for cores.
    wait_for("jobs to complete", lambda: get_json(system, f"/api/v1alpha/batches/{batch_id}")[
        "n_completed"] >= 10)
    leader = system.schedulers["scheduler-a"]
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait(timeout=10)
    status = get_json(system, f"/api/v1alpha/batches/{batch_id}")
    assert not status["complete"], "the batch finished before the failover"

    r = system.hail("wait_batch", str(batch_id))
    assert standby.poll() is None, "the standby died"
    assert r["batch"]["state"] == "success" and r["batch"]["n_succeeded"] == 160
    assert set(r["states"].values()) == {"Success"}
    for job_id, attempts in r["attempts"].items():
        spans = sorted((a["start_time"], a["end_time"] or "~") for a in attempts
                       if a["start_time"])
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"job {job_id} ran twice at once: {attempts}"
    log = (system.tmp / "scheduler-b.log").read_text()
    assert "elected with epoch 2" in log
