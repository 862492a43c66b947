"""Billing end to end: attempts accrue cost with heartbeats, every status and list shows it,
billing endpoints roll it up, and a billing project over its limit is stopped."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import pytest

from schemas.control import BillingLimitSet, BillingProjectCreated, BillingProjectMemberAdded

from .conftest import System, get_json, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RESOURCES = {"compute/standard-preemptible/1", "memory/standard-preemptible/1",
             "service-fee/1", "ip-fee/1024/1"}


def test_cost_in_statuses_lists_and_billing(running_system: System) -> None:
    system = running_system
    r = system.hail("billed_batch")
    batch, listed, jobs = r["batch"], r["listed"], r["jobs"]
    assert batch["state"] == "success" and batch["complete"], batch
    assert batch["cost"] > 0
    assert {c["resource"] for c in batch["cost_breakdown"]} == RESOURCES, batch
    assert math.isclose(sum(c["cost"] for c in batch["cost_breakdown"]), batch["cost"],
                        rel_tol=1e-9)
    # 0.25 cpu for at least the 3 s and 4 s the jobs slept (and less than a minute each)
    assert 250 * 7_000 <= batch["msec_mcpu"] < 250 * 120_000, batch
    for job in jobs.values():
        assert job["cost"] > 0 and {c["resource"] for c in job["cost_breakdown"]} == RESOURCES
        assert job["msec_mcpu"] >= 250 * 3_000
    assert math.isclose(sum(j["cost"] for j in jobs.values()), batch["cost"], rel_tol=1e-9)
    assert batch["msec_mcpu"] == sum(j["msec_mcpu"] for j in jobs.values())
    for entry in listed:  # the job list carries the same cost as each job's status
        assert entry["cost_breakdown"] == jobs[str(entry["job_id"])]["cost_breakdown"]
        assert entry["cost"] > 0
    listed_batch = next(b for b in get_json(system, "/api/v1alpha/batches")["batches"]
                        if b["id"] == batch["id"])
    assert math.isclose(listed_batch["cost"], batch["cost"], rel_tol=1e-9)
    assert listed_batch["cost_breakdown"] and listed_batch["msec_mcpu"] == batch["msec_mcpu"]
    group = get_json(system, f"/api/v1alpha/batches/{batch['id']}/job-groups/0")
    assert math.isclose(group["cost"], batch["cost"], rel_tol=1e-9)
    project = get_json(system, f"/api/v1alpha/billing_projects/{system.billing_project}")
    assert project["accrued_cost"] >= batch["cost"] * (1 - 1e-9)
    spent = get_json(system, "/api/v1alpha/billing")
    mine = [s for s in spent if s["billing_project"] == system.billing_project
            and s["user"] == system.user]
    assert len(mine) == 1 and mine[0]["total_spent"] >= batch["cost"] * (1 - 1e-9)


def test_a_billing_project_over_its_limit_is_cancelled_and_refused(
        running_system: System) -> None:
    system = running_system
    # two 0.25-core sleepers cost about $0.0000028 a second: the limit is reached in seconds
    system.append([BillingProjectCreated(billing_project="capped"),
                   BillingProjectMemberAdded(billing_project="capped", user=system.user),
                   BillingLimitSet(billing_project="capped", limit=Decimal("0.00001"))])
    capped = dataclasses.replace(system, billing_project="capped")
    batch_id = capped.hail("submit_sleepers", "2", "300")["id"]

    def cancelled() -> dict[str, object] | None:
        status = get_json(system, f"/api/v1alpha/batches/{batch_id}")
        return status if status["complete"] else None

    status = wait_for("the over-limit batch to be cancelled", cancelled, timeout=90)
    assert status["state"] == "cancelled" and status["n_cancelled"] == 2, status
    assert 0 < status["cost"] < 0.001, status  # it ran, and stopped long before 300 s
    project = get_json(system, "/api/v1alpha/billing_projects/capped")
    assert project["accrued_cost"] >= 0.00001 and project["limit"] == 0.00001
    refused = capped.hail("submit_refused")
    assert refused.get("status") == 403, refused
    assert "exceeded the budget" in str(refused["message"]), refused
    # the other project is not affected
    assert "id" in system.hail("submit_refused")
