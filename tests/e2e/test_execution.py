"""Jobs run end to end: the official client submits, the scheduler starts local workers and
dispatches, workers run the commands and report, the projector folds it all, ingest answers."""

from __future__ import annotations

import itertools

import pytest

from services.scheduler.drivers.local import reap_instances

from .conftest import System, get_json, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_true_false_echo_missing_executable_and_timeout(running_system: System) -> None:
    r = running_system.hail("run_basic")
    batch = r["batch"]
    assert batch["complete"] is True and batch["state"] == "failure"
    assert batch["n_jobs"] == 5 and batch["n_completed"] == 5
    assert batch["n_succeeded"] == 2 and batch["n_failed"] + batch["n_cancelled"] <= 3
    assert batch["time_completed"] is not None
    assert r["ok"]["state"] == "Success" and r["ok"]["exit_code"] == 0
    assert r["bad"]["state"] == "Failed" and r["bad"]["exit_code"] == 1
    # Their MJCs carried no document (the common attempt): the API renders it from the facts.
    for name, state, code in (("ok", "succeeded", 0), ("bad", "failed", 1)):
        assert r[name]["main_state"] == state and r[name]["timing"] == ["running"]
        assert r[name]["container_exit_code"] == code
        doc = r[name]["document"]
        assert doc["state"] == state and doc["batch_id"] == batch["id"]
        assert doc["user"] and doc["worker"] and doc["start_time"]
    assert r["echo"]["state"] == "Success"
    assert r["missing"]["state"] == "Error"
    assert "/no/such/executable-hs" in r["missing"]["error"]
    assert r["timeout"]["state"] == "Error"
    assert "ContainerTimeoutError" in r["timeout"]["error"]
    assert r["log"]["main"] == "hello\nbonjour\n"
    assert r["container_log"] == "hello\nbonjour\n"
    assert r["silent_log"] == {"main": ""} and r["silent_container_log"] == ""
    (attempt,) = r["attempts"]
    assert attempt["start_time"] and attempt["end_time"] and attempt["attempt_id"]
    assert r["listed"] == {"1": "Success", "2": "Failed", "3": "Success", "4": "Error",
                           "5": "Error"}


def test_dag_parent_failure_cancels_children_but_not_always_run(running_system: System) -> None:
    r = running_system.hail("dag")
    assert r["states"] == {"root": "Failed", "child": "Cancelled", "cleanup": "Success",
                           "ok": "Success", "after_ok": "Success"}
    assert r["batch"]["complete"] is True and r["batch"]["state"] == "failure"


def test_cancel_kills_running_jobs_and_still_runs_always_run(running_system: System) -> None:
    r = running_system.hail("cancel")
    assert r["was_running"] is True
    assert r["batch"]["state"] == "cancelled" and r["batch"]["complete"] is True
    assert r["running"]["state"] == "Cancelled"
    assert r["last"] == "Success"  # always_run: runs after its parent was cancelled
    assert set(r["states"]) == {"Cancelled", "Success"}
    assert r["seconds"] < 60


def test_cancel_after_n_failures_per_batch_and_per_group(running_system: System) -> None:
    r = running_system.hail("n_failures")
    # A failed job outranks the cancel in the reported state, as in the reference.
    assert r["batch"]["state"] == "failure" and r["batch"]["complete"] is True
    assert r["batch"]["n_cancelled"] >= 1  # the sleeping blocker (the true job may have run)
    assert r["blocker"] == "Cancelled"
    assert r["group"]["state"] == "failure" and r["group"]["complete"] is True
    assert r["slow"] == "Cancelled"
    assert r["outside"] == "Success"  # the group's failures do not cancel the rest of the batch
    assert r["batch2"]["complete"] is True


def test_job_groups_complete_with_their_jobs(running_system: System) -> None:
    r = running_system.hail("job_groups_run")
    assert r["batch"]["complete"] is True and r["batch"]["state"] == "failure"
    assert r["inner"]["complete"] is True and r["inner"]["state"] == "failure"
    assert r["inner"]["n_succeeded"] == 1 and r["inner"]["n_failed"] == 1
    assert r["outer"]["complete"] is True and r["outer"]["n_jobs"] == 3
    assert r["outer"]["time_completed"] is not None


def test_a_hundred_noops(running_system: System) -> None:
    r = running_system.hail("many_noops", "100")
    assert r["batch"]["complete"] is True and r["batch"]["state"] == "success"
    assert r["batch"]["n_succeeded"] == 100


def test_a_lost_worker_makes_a_new_attempt(running_system: System) -> None:
    system = running_system
    batch_id = system.hail("submit_sleepers", "2", "8")["id"]
    wait_for("the jobs to run", lambda: all(
        get_json(system, f"/api/v1alpha/batches/{batch_id}/jobs/{j}")["state"] == "Running"
        for j in (1, 2)))
    killed = reap_instances(system.env["HS_DATA_DIR"])  # every worker dies mid-job
    assert killed
    r = system.hail("wait_batch", str(batch_id))
    assert r["batch"]["state"] == "success" and r["batch"]["n_succeeded"] == 2, r
    for attempts in r["attempts"].values():
        # At least the killed attempt and the one that succeeded; a busy machine may lose more
        # (a delivery refused by a second dead worker before it is detected as lost).
        assert len(attempts) >= 2, r
        assert all(a["end_time"] is not None for a in attempts), r
        started = sorted((a for a in attempts if a["start_time"] is not None),
                         key=lambda a: a["start_time"])
        for before, after in itertools.pairwise(started):
            assert before["end_time"] <= after["start_time"], r  # never two at once
