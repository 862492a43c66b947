"""Instance collections end to end, with small (4-core) pool workers: a job naming a machine
type gets an instance of its own, a job bigger than any pool worker is reported (it ends in
Error with the reason) instead of waiting forever, and idle instances are deleted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.common.settings import DatabaseSettings
from services.scheduler.drivers.local import running_workers

from .conftest import SCHEDULER_ENV, System, start_system, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def small_workers(broker: str, migrated_db: DatabaseSettings,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("small"),
                            scheduler_env={**SCHEDULER_ENV, "HS_SCHEDULER_WORKER_CORES": "4",
                                           "HS_SCHEDULER_IDLE_S": "2"})


def test_job_private_instance_and_a_job_that_can_never_fit(small_workers: System) -> None:
    r = small_workers.hail("machine_types")
    assert r["batch"]["complete"] is True
    private = r["private"]
    assert private["state"] == "Success", private
    assert private["status"]["worker"].startswith("job-private-")
    assert r["private_log"]["main"] == "1\n"
    big = r["big"]
    assert big["state"] == "Error"
    assert big["status"]["error"] == (
        "unschedulable: needs 8000 mCPU; the largest standard worker has 4000 mCPU")


def test_idle_instances_are_deleted(small_workers: System) -> None:
    data_dir = small_workers.env["HS_DATA_DIR"]
    r = small_workers.hail("many_noops", "8")
    assert r["batch"]["state"] == "success"
    # The workers that ran them go once idle for 2 s; nothing else is running.
    wait_for("idle workers to be deleted", lambda: not running_workers(data_dir), timeout=30)
    log = (small_workers.tmp / "scheduler-a.log").read_text()
    assert ": deleted" in log
