"""Compatibility: the official hailtop client (0.2.139, unmodified) against the system.

Jobs do not run until the scheduler exists, so these assert Pending/Ready states and counts.
"""

from __future__ import annotations

import pytest

from .conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_create_fast_with_a_dependency(system: System) -> None:
    r = system.hail("create_fast_dependency")
    assert r["fast"] is True
    s = r["status"]
    assert s["n_jobs"] == 2 and s["state"] == "running" and not s["complete"]
    assert s["closed"] is True and s["billing_project"] == system.billing_project
    assert s["user"] == system.user and s["attributes"] == {"name": "dep"}
    assert s["time_created"].endswith("Z") and s["time_closed"] is not None
    assert r["states"] == {"1": "Ready", "2": "Pending"}
    assert r["names"] == ["first", None]
    job2 = r["job2"]
    assert job2["spec"]["process"]["command"] == ["echo", "hi"]
    assert job2["state"] == "Pending" and job2["status"] is None


def test_five_thousand_jobs_in_bunches(system: System) -> None:
    r = system.hail("big_batch", "5000")
    assert r["fast"] is False  # more than one bunch: create, bunches, commit
    assert r["status"]["n_jobs"] == 5000 and r["status"]["state"] == "running"
    assert r["group"]["n_jobs"] == 5000
    assert r["n_ready_listed"] == 5000


def test_a_batch_submitted_with_no_jobs_is_complete_and_an_update_reopens_it(
        system: System) -> None:
    r = system.hail("empty_batch")
    first = r["first"]
    assert first["complete"] is True and first["state"] == "success" and first["n_jobs"] == 0
    assert first["closed"] is True and first["time_completed"] is not None
    after = r["after_update"]
    assert after["n_jobs"] == 1 and after["state"] == "running" and after["complete"] is False
    assert after["time_completed"] is None


def test_updates_with_dependencies_across_updates(system: System) -> None:
    r = system.hail("updates")
    assert r["status"]["n_jobs"] == 3 + 1100
    assert r["ids"] == [2, 3]
    assert r["first"] == {"1": "Ready", "2": "Pending", "3": "Ready"}
    assert r["n_pending"] == 1 + 1100


def test_nested_groups_and_cancelling_a_group(system: System) -> None:
    r = system.hail("groups")
    assert r["before"]["outer"]["n_jobs"] == 3 and r["before"]["inner"]["n_jobs"] == 2
    assert r["before"]["outer"]["state"] == "running"
    assert r["children"] == [1, 3]
    assert r["n_recursive"] == 3 and r["n_direct"] == 1
    assert r["after"]["outer"]["state"] == "cancelled"
    assert r["after"]["inner"]["state"] == "cancelled"
    assert r["after"]["other"]["state"] == "running"
    assert r["after"]["batch"]["state"] == "running"
    assert r["missing_cancel"] is not None and "403" in r["missing_cancel"]


def test_listing_with_v1_and_v2_queries(system: System) -> None:
    r = system.hail("queries")
    assert r["all"] == 60 and r["v1_even"] == 30 and r["v1_not_even"] == 30
    assert r["v2_name"] == [8] and r["v2_exact_word"] == [8]
    assert r["v2_jobid"] == 10
    assert r["v1_batches"] == [r["id"]] and r["v2_batches"] == [r["id"]]
    assert r["mine"] == 5
    assert "unknown state" in r["errors"]["state = bogus"]
    assert "expected int, but found" in r["errors"]["job_id >= x"]
    assert r["errors"]["a b c d e ="] is not None


def test_recreating_a_batch_by_token_is_idempotent(system: System) -> None:
    r = system.hail("token_idempotent")
    assert r["ids"][0] == r["ids"][1]
    assert r["n_jobs"] == 1


def test_error_cases(system: System) -> None:
    r = system.hail("errors")
    assert "400" in r["bad_memory"] and "memory" in r["bad_memory"]
    assert "400" in r["bad_cpu"]
    assert "400" in r["bad_timeout"] and "timeout" in r["bad_timeout"]
    assert "404" in r["missing_batch"]
    assert "403" in r["unknown_project"] and "no-such-project" in r["unknown_project"]
    assert "400" in r["cancelled_batch"] and "cancelled batch" in r["cancelled_batch"]
    assert "BatchNotAuthenticatedError" in r["bad_token"] or "401" in r["bad_token"]


def test_billing_projects_for_a_member(system: System) -> None:
    r = system.hail("billing_member")
    assert [p["billing_project"] for p in r["list"]] == [system.billing_project]
    assert r["get"]["users"] == ["tester"] and r["get"]["status"] == "open"
    assert r["get"]["accrued_cost"] == 0.0 and r["get"]["limit"] is None
    assert "403" in r["unknown"] and "Unknown Hail Batch billing project nope." in r["unknown"]
    assert "403" in r["create"]
    assert r["attempts"] is None and r["log"] == {"main": None}


def test_billing_projects_for_a_developer(system: System) -> None:
    r = system.hail("billing_developer", developer=True)
    assert r["add"]["user"] == "tester" and r["limit"]["limit"] == 12.5
    assert r["after"]["users"] == ["tester"] and r["after"]["limit"] == 12.5
    assert "403" in r["delete_open"] and "must be closed" in r["delete_open"]
    assert r["closed"] == "closed"
    assert r["listed_after_delete"] is False
