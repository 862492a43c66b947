"""Bad input over raw HTTP: clear 4xx errors, and nothing applied halfway."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import sqlalchemy as sa

from schemas.control import ServiceFreezeSet

from .conftest import System

pytestmark = [pytest.mark.e2e]


def call(system: System, method: str, path: str, body: bytes | None = None,
         token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(system.url + path, data=body, method=method, headers={
        "Authorization": f"Bearer {token or system.token}",
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        with e:  # the error holds the response; close it
            return e.code, e.read().decode()


def batch_count(system: System) -> int:
    with system.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT COUNT(*) FROM batches")).scalar_one())


def fast(jobs: list[dict[str, Any]], token: str, n_jobs: int | None = None) -> bytes:
    return json.dumps({"bunch": jobs, "job_groups": [], "batch": {
        "billing_project": "e2e", "n_jobs": len(jobs) if n_jobs is None else n_jobs,
        "token": token}}).encode()


def job(i: int, **extra: Any) -> dict[str, Any]:
    return {"job_id": i, "process": {"type": "docker", "image": "u", "command": ["true"]},
            **extra}


@pytest.mark.parametrize(("body", "status", "text"), [
    (b"{not json", 400, "malformed JSON"),
    (b"[1, 2]", 400, ""),
    (fast([job(1), job(2, unknown_key=1)], "t-unknown"), 400, "unknown_key"),
    (fast([job(1), job(3)], "t-gap"), 400, ""),
    (fast([job(1, in_update_parent_ids=[1])], "t-self"), 400, ""),
    (fast([job(1)], "t-count", n_jobs=2), 400, "wrong number of jobs"),
    (fast([job(1, resources={"cpu": "64"})], "t-huge"), 400, "unsatisfiable"),
], ids=["malformed", "not-an-object", "unknown-key", "id-gap", "self-parent", "count",
        "unsatisfiable"])
def test_invalid_create_fast_is_a_400_and_applies_nothing(
        system: System, body: bytes, status: int, text: str) -> None:
    before = batch_count(system)
    code, message = call(system, "POST", "/api/v1alpha/batches/create-fast", body)
    assert code == status, message
    assert text in message
    assert message.strip(), "an error says what is wrong"
    assert batch_count(system) == before


def test_oversized_body_is_rejected(system: System) -> None:
    body = b'{"pad": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    code, _ = call(system, "POST", "/api/v1alpha/batches/create-fast", body)
    assert code == 413


def test_eight_mebibyte_body_is_accepted_for_parsing(system: System) -> None:
    """A body just under the 8 MiB limit is read (and here refused for its content only)."""
    body = b'{"pad": "' + b"x" * (8 * 1024 * 1024 - 20) + b'"}'
    code, message = call(system, "POST", "/api/v1alpha/batches/create-fast", body)
    assert code == 400 and "pad" in message


def test_unauthenticated(system: System) -> None:
    assert call(system, "GET", "/api/v1alpha/batches", token="nope")[0] == 401
    req = urllib.request.Request(system.url + "/api/v1alpha/batches")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    with e.value:
        assert e.value.code == 401


def test_batches_of_other_projects_are_404(system: System) -> None:
    code, created = call(system, "POST", "/api/v1alpha/batches/create-fast",
                         fast([job(1)], "t-private"), token=system.dev_token)
    assert code == 403  # boss is not a member of e2e
    code, created = call(system, "POST", "/api/v1alpha/batches/create-fast",
                         fast([job(1)], "t-mine"))
    assert code == 200
    batch_id = json.loads(created)["id"]
    assert call(system, "GET", f"/api/v1alpha/batches/{batch_id}", token=system.dev_token
                )[0] == 404
    assert call(system, "GET", f"/api/v1alpha/batches/{batch_id}")[0] == 200


def test_container_logs(system: System) -> None:
    code, created = call(system, "POST", "/api/v1alpha/batches/create-fast",
                         fast([job(1)], "t-logs"))
    assert code == 200
    b = json.loads(created)["id"]
    code, text = call(system, "GET", f"/api/v1alpha/batches/{b}/jobs/1/log/sidecar")
    assert code == 400 and "unknown container" in text
    code, text = call(system, "GET", f"/api/v1alpha/batches/{b}/jobs/1/log/main")
    assert code == 404 and "has not run" in text
    assert call(system, "GET", f"/api/v1alpha/batches/{b}/jobs/2/log/main")[0] == 404


def test_frozen_service_refuses_submissions_with_503(system: System) -> None:
    code, created = call(system, "POST", "/api/v1alpha/batches/create-fast",
                         fast([job(1)], "t-before-freeze"))
    assert code == 200
    b = json.loads(created)["id"]
    system.append([ServiceFreezeSet(frozen=True, reason="test")])
    try:
        time.sleep(2.5)  # ingest caches the switch for 2 s
        code, text = call(system, "POST", "/api/v1alpha/batches/create-fast",
                          fast([job(1)], "t-frozen"))
        assert code == 503 and "frozen" in text
        assert call(system, "GET", f"/api/v1alpha/batches/{b}")[0] == 200  # reads still work
        code, usage = call(system, "GET", f"/api/v1alpha/batches/{b}/jobs/1/resource_usage")
        assert code == 200 and json.loads(usage) == {}
    finally:
        system.append([ServiceFreezeSet(frozen=False)])
    time.sleep(2.5)
    assert call(system, "POST", "/api/v1alpha/batches/create-fast",
                fast([job(1)], "t-thawed"))[0] == 200
