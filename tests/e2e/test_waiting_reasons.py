"""Why isn't my job running: a job that waits for cores shows why, and the reason clears when it
runs. One-core pool workers and at most one instance per pool: four quarter-core sleepers fill
the only worker, the fifth waits (no fitting instance, the pool at its maximum)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from services.common.settings import DatabaseSettings
from services.ingest.ui.session import SESSION_COOKIE

from .conftest import SCHEDULER_ENV, System, get_json, start_system, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def one_small_worker(broker: str, migrated_db: DatabaseSettings,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("waiting"),
                            scheduler_env={**SCHEDULER_ENV, "HS_SCHEDULER_WORKER_CORES": "1",
                                           "HS_SCHEDULER_MAX_INSTANCES": "1"})


def jobs(system: System, batch_id: int) -> dict[int, Any]:
    return {j: get_json(system, f"/api/v1alpha/batches/{batch_id}/jobs/{j}")
            for j in range(1, 6)}


def test_a_job_waiting_for_cores_says_why_until_it_runs(one_small_worker: System) -> None:
    system = one_small_worker
    batch_id = system.hail("submit_sleepers", "5", "8")["id"]

    def one_waits() -> Any:
        status = jobs(system, batch_id)
        running = [j for j, s in status.items() if s["state"] == "Running"]
        ready = [s for s in status.values() if s["state"] == "Ready"]
        # The reason first said may predate the worker (all five waited for the autoscaler);
        # the scheduler republishes a changed message within a second or so.
        if len(running) == 4 and len(ready) == 1 and ready[0]["waiting_reason"] and (
                "maximum" in ready[0]["waiting_reason"]["message"]):
            return ready[0]
        return None

    waiting = wait_for("four jobs running and the fifth saying why it waits", one_waits)
    reason = waiting["waiting_reason"]
    assert reason["reason"] == "no_fit", reason
    assert "no active standard instance has free cores" in reason["message"], reason
    assert "maximum of 1 instances" in reason["message"], reason
    assert reason["since"] and reason["since_ms"] > 0
    # The job's page in the web UI says the same (the session cookie holds the token).
    page = _ui_page(system, f"/ui/batches/{batch_id}/jobs/{waiting['job_id']}")
    assert 'id="waiting-reason"' in page and "no_fit" in page, page[:2000]
    assert "no active standard instance has free cores" in page
    assert all(s["waiting_reason"] is None for s in jobs(system, batch_id).values()
               if s["state"] != "Ready")

    job_id = waiting["job_id"]
    ran = wait_for("the waiting job to run", lambda: (s := get_json(
        system, f"/api/v1alpha/batches/{batch_id}/jobs/{job_id}"))["state"] in (
        "Running", "Success") and s)
    assert ran["waiting_reason"] is None
    # Once nothing waits, the scheduler clears what it said (the projection holds no reason).
    wait_for("the reasons to be cleared", lambda: not _reasons(system.engine, system.user))


def _ui_page(system: System, path: str) -> str:
    request = urllib.request.Request(f"{system.url}{path}",
                                     headers={"Cookie": f"{SESSION_COOKIE}={system.token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return str(resp.read().decode())


def _reasons(engine: sa.Engine, user: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT reason FROM user_waiting_reasons WHERE user = :u UNION ALL "
            "SELECT reason FROM job_waiting_reasons WHERE user = :u"), {"u": user}))
