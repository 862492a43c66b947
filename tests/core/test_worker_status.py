"""The worker's status document and MJC, checked against how the official client reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import AttemptResource, CompletedJobState
from schemas.execution import JobCompleted
from services.worker.runtime import Outcome
from services.worker.status import (
    api_exit_code,
    attempt_completed,
    attempt_state,
    compact_main,
    compact_status,
    container_status,
    job_completed,
    job_status,
    runs_output,
    spec_tasks,
)

SPEC: dict[str, Any] = {"job_id": 1, "process": {"type": "docker", "image": "ubuntu",
                                                 "command": ["true"]}}
FILES = [{"from": "gs://b/x", "to": "/io/x"}]


def _outcome(state: CompletedJobState = "Success", exit_code: int | None = 0,
             **kw: Any) -> Outcome:
    return Outcome(state=state, exit_code=exit_code, start_time_ms=1_000, end_time_ms=3_500,
                   **kw)


SUCCESS = _outcome()
FAILED = _outcome("Failed", 3)
TIMED_OUT = _outcome("Error", 143, error="ContainerTimeoutError: timed out after 1s",
                     short_error="timed out", timed_out=True)
NOT_FOUND = _outcome("Error", None, error="executable file `foo` not found in $PATH",
                     short_error="executable not found")
CANCELLED = _outcome("Cancelled", 143)


def _status(outcomes: dict[str, Outcome], spec: dict[str, Any] | None = None,
            **kw: Any) -> dict[str, Any]:
    return job_status(spec=spec or SPEC, outcomes=outcomes, batch_id=7, job_id=1,
                      attempt_id="a1b2c3", user="alice", worker="worker-std-0001",
                      region="us-central1", start_time_ms=900, end_time_ms=4_000,
                      resources=[AttemptResource(resource="compute/n1-preemptible/1",
                                                 quantity=1000)], **kw)


def test_document_has_the_reference_shape() -> None:
    doc = _status({"main": SUCCESS})
    assert doc == {
        "version": 5,
        "worker": "worker-std-0001",
        "batch_id": 7,
        "job_id": 1,
        "attempt_id": "a1b2c3",
        "user": "alice",
        "state": "succeeded",
        "format_version": 7,
        "resources": [{"name": "compute/n1-preemptible/1", "quantity": 1000}],
        "region": "us-central1",
        "start_time": 900,
        "end_time": 4_000,
        "container_statuses": {"main": {
            "name": "batch-7-job-1-main",
            "state": "succeeded",
            "timing": {"running": {"start_time": 1_000, "finish_time": 3_500,
                                   "duration": 2_500}},
            "container_status": {"state": "finished", "started_at": 1_000,
                                 "finished_at": 3_500, "exit_code": 0,
                                 "out_of_memory": False},
        }},
        "timing": {},
    }
    json.dumps(doc)  # JSON-ready


def test_error_container_has_error_and_short_error() -> None:
    main = _status({"main": TIMED_OUT})["container_statuses"]["main"]
    assert main["state"] == "error"
    assert main["error"] == "ContainerTimeoutError: timed out after 1s"
    assert main["short_error"] == "timed out"


@pytest.mark.parametrize(("outcome", "state"), [(NOT_FOUND, "error"), (CANCELLED, "cancelled")],
                         ids=["never-started", "cancelled"])
def test_no_container_status_without_an_exit(outcome: Outcome, state: str) -> None:
    main = _status({"main": outcome})["container_statuses"]["main"]
    assert "container_status" not in main and main["state"] == state


@pytest.mark.parametrize(("spec", "tasks"), [
    (SPEC, ("main",)),
    ({**SPEC, "input_files": FILES}, ("input", "main")),
    ({**SPEC, "output_files": FILES}, ("main", "output")),
    ({**SPEC, "input_files": FILES, "output_files": FILES}, ("input", "main", "output")),
    ({**SPEC, "input_files": [], "output_files": None}, ("main",)),
], ids=["none", "input", "output", "both", "empty"])
def test_containers_follow_the_spec_files(spec: dict[str, Any], tasks: tuple[str, ...]) -> None:
    assert spec_tasks(spec) == tasks
    assert tuple(_status({"main": SUCCESS}, spec)["container_statuses"]) == tasks


def test_a_container_that_never_ran_is_pending() -> None:
    spec = {**SPEC, "input_files": FILES, "output_files": FILES}
    doc = _status({"input": FAILED}, spec)
    assert doc["state"] == "failed"
    assert doc["container_statuses"]["main"] == {"name": "batch-7-job-1-main",
                                                  "state": "pending", "timing": {}}
    assert container_status("x", None)["state"] == "pending"


@pytest.mark.parametrize(("outcomes", "state"), [
    ({"main": SUCCESS}, "Success"),
    ({"main": FAILED}, "Failed"),
    ({"main": TIMED_OUT}, "Error"),
    ({"main": CANCELLED}, "Cancelled"),
    ({"input": FAILED}, "Failed"),
    ({"input": SUCCESS, "main": SUCCESS, "output": TIMED_OUT}, "Error"),
    ({"input": SUCCESS, "main": FAILED, "output": SUCCESS}, "Failed"),
    ({"input": SUCCESS, "main": SUCCESS, "output": SUCCESS}, "Success"),
], ids=["ok", "failed", "error", "cancelled", "input-failed", "output-error",
        "main-decides", "all-ok"])
def test_attempt_state(outcomes: dict[str, Outcome], state: str) -> None:
    assert attempt_state(outcomes) == state


@pytest.mark.parametrize(("spec", "main", "runs"), [
    (SPEC, SUCCESS, False),
    ({**SPEC, "output_files": FILES}, SUCCESS, True),
    ({**SPEC, "output_files": FILES}, FAILED, True),
    ({**SPEC, "output_files": FILES, "always_copy_output": False}, FAILED, False),
    ({**SPEC, "output_files": FILES, "always_copy_output": False}, SUCCESS, True),
], ids=["no-files", "ok", "failed-default-copies", "failed-no-copy", "ok-no-copy-flag"])
def test_runs_output(spec: dict[str, Any], main: Outcome, runs: bool) -> None:
    assert runs_output(spec, main) is runs


def _client_exit_code(status: dict[str, Any]) -> int | None:
    """The official client's rule, restated from hailtop.batch_client.aioclient.Job."""
    if status.get("error") is not None:
        return None
    codes: dict[str, int | None] = {}
    for task, cs in status["container_statuses"].items():
        if cs.get("error") is not None:
            codes[task] = None
        else:
            codes[task] = (cs.get("container_status") or {}).get("exit_code")
    for task in ("input", "main", "output"):
        if task in codes:
            code = codes[task]
            if code is None:
                return None
            if code > 0:
                return code
    return 0


@pytest.mark.parametrize(("outcomes", "spec", "code"), [
    ({"main": SUCCESS}, SPEC, 0),
    ({"main": FAILED}, SPEC, 3),
    ({"main": TIMED_OUT}, SPEC, None),
    ({"main": NOT_FOUND}, SPEC, None),
    ({"input": FAILED}, {**SPEC, "input_files": FILES}, 3),
    ({"input": TIMED_OUT}, {**SPEC, "input_files": FILES}, None),
    ({"main": SUCCESS, "output": FAILED}, {**SPEC, "output_files": FILES}, 3),
], ids=["ok", "failed", "timed-out", "not-found", "input-failed", "input-error",
        "output-failed"])
def test_api_exit_code(outcomes: dict[str, Outcome], spec: dict[str, Any],
                       code: int | None) -> None:
    doc = _status(outcomes, spec)
    assert api_exit_code(doc) == code == _client_exit_code(doc)


def test_worker_error_wins() -> None:
    doc = _status({}, error="disk full while setting up /io")
    assert doc["state"] == "error" and doc["error"] == "disk full while setting up /io"
    assert api_exit_code(doc) is None
    assert api_exit_code(None) is None


@pytest.mark.parametrize(("outcome", "state", "exit_code", "error"), [
    (SUCCESS, "Success", 0, None),
    (FAILED, "Failed", 3, None),
    (TIMED_OUT, "Error", None, "ContainerTimeoutError: timed out after 1s"),
    (NOT_FOUND, "Error", None, "executable file `foo` not found in $PATH"),
    (CANCELLED, "Cancelled", None, None),
], ids=["success", "failed", "timed-out", "not-found", "cancelled"])
def test_job_completed(outcome: Outcome, state: str, exit_code: int | None,
                       error: str | None) -> None:
    doc = _status({"main": outcome})
    mjc = job_completed(doc, instance_name="worker-std-0001")
    assert isinstance(mjc, JobCompleted)
    assert (mjc.batch_id, mjc.job_id, mjc.attempt_id) == (7, 1, "a1b2c3")
    assert (mjc.state, mjc.exit_code, mjc.error) == (state, exit_code, error)
    assert (mjc.start_time_ms, mjc.end_time_ms) == (900, 4_000)
    assert mjc.status is not None and json.loads(mjc.status) == doc


_outcomes = st.builds(
    Outcome,
    state=st.sampled_from(["Success", "Failed", "Error", "Cancelled"]),
    exit_code=st.none() | st.integers(0, 255),
    error=st.none() | st.text(max_size=20),
    start_time_ms=st.integers(0, 10**6),
    end_time_ms=st.integers(10**6, 2 * 10**6),
)


@given(st.dictionaries(st.sampled_from(["input", "main", "output"]), _outcomes))
def test_exit_code_always_matches_the_client(outcomes: dict[str, Outcome]) -> None:
    spec = {**SPEC, "input_files": FILES, "output_files": FILES}
    doc = _status(outcomes, spec)
    assert api_exit_code(doc) == _client_exit_code(doc)
    assert doc["state"] in ("succeeded", "failed", "error", "cancelled")


_any_outcome = st.builds(
    Outcome,
    state=st.sampled_from(["Success", "Failed", "Error", "Cancelled"]),
    exit_code=st.none() | st.integers(0, 255),
    error=st.none() | st.text(max_size=20),
    short_error=st.none() | st.sampled_from(["timed out", "executable not found"]),
    timed_out=st.booleans(),
    out_of_memory=st.booleans(),
    start_time_ms=st.integers(0, 10**6),
    end_time_ms=st.integers(10**6, 2 * 10**6),
)
_resources = st.lists(st.builds(AttemptResource, resource=st.sampled_from(
    ["compute/n1-preemptible/1", "memory/n1-preemptible/1", "service-fee/1", "ip-fee/1024/1"]),
    quantity=st.integers(1, 10**6)), unique_by=lambda r: r.resource, max_size=4)


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["input", "main", "output"]), _any_outcome,
                       min_size=1),
       st.sampled_from([SPEC, {**SPEC, "input_files": FILES}, {**SPEC, "output_files": FILES}]),
       st.none() | st.sampled_from(["worker error: disk full"]),
       st.none() | st.sampled_from(["us-central1", "westus"]), _resources)
def test_a_compact_mjc_renders_the_workers_document(
        outcomes: dict[str, Outcome], spec: dict[str, Any], error: str | None,
        region: str | None, resources: list[AttemptResource]) -> None:
    """An MJC without its document carries all the document follows from: what the API
    renders from the MJC's facts is the document the worker had. Every other MJC carries
    the document itself."""
    doc = job_status(spec=spec, outcomes=outcomes, batch_id=7, job_id=1, attempt_id="a1b2c3",
                     user="alice", worker="worker-std-0001", region=region,
                     start_time_ms=900, end_time_ms=4_000, resources=resources, error=error)
    main = compact_main(spec, outcomes, error)
    mjc = job_completed(doc, instance_name="worker-std-0001", resources=resources,
                        compact=main)
    assert mjc.region == region
    if main is None:
        assert mjc.status is not None and json.loads(mjc.status) == doc
        assert mjc.main_start_ms is None and mjc.main_end_ms is None
        return
    only_main = set(outcomes) == {"main"} and spec_tasks(spec) == ("main",)
    assert only_main and error is None and main.exit_code is not None
    assert main.state in ("Success", "Failed") and not (main.timed_out or main.out_of_memory)
    assert mjc.status is None and mjc.exit_code is not None and mjc.start_time_ms is not None
    assert mjc.main_start_ms is not None and mjc.main_end_ms is not None
    rendered = compact_status(
        batch_id=mjc.batch_id, job_id=mjc.job_id, attempt_id=mjc.attempt_id, user="alice",
        worker=mjc.instance_name, region=mjc.region, state=mjc.state, exit_code=mjc.exit_code,
        start_time_ms=mjc.start_time_ms, end_time_ms=mjc.end_time_ms,
        main_start_ms=mjc.main_start_ms, main_end_ms=mjc.main_end_ms,
        resources=reversed(mjc.resources))  # read back by name, in any order
    assert rendered == doc


def test_the_common_attempt_is_compact() -> None:
    """A job whose main container ran to an exit, alone and without error, is compact; a
    timeout, a missing executable, a cancel, a worker error or a spec with files is not."""
    assert compact_main(SPEC, {"main": SUCCESS}, None) == SUCCESS
    assert compact_main(SPEC, {"main": FAILED}, None) == FAILED
    for outcome in (TIMED_OUT, NOT_FOUND, CANCELLED):
        assert compact_main(SPEC, {"main": outcome}, None) is None
    assert compact_main(SPEC, {"main": SUCCESS}, "worker error: disk full") is None
    assert compact_main({**SPEC, "output_files": FILES}, {"main": SUCCESS}, None) is None
    assert compact_main(SPEC, {}, None) is None


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["input", "main", "output"]), _any_outcome),
       st.sampled_from([SPEC, {**SPEC, "input_files": FILES}, {**SPEC, "output_files": FILES}]),
       st.none() | st.sampled_from(["worker error: disk full"]),
       st.none() | st.sampled_from(["us-central1", "westus"]), _resources, st.booleans())
def test_an_attempts_mjc_is_the_one_its_document_makes(
        outcomes: dict[str, Outcome], spec: dict[str, Any], error: str | None,
        region: str | None, resources: list[AttemptResource], start_reported: bool) -> None:
    """The worker's MJC, made without a document where it carries none, is the event made
    from the attempt's whole document: field for field, for every attempt."""
    facts: dict[str, Any] = dict(
        spec=spec, outcomes=outcomes, batch_id=7, job_id=1, attempt_id="a1b2c3", user="alice",
        worker="worker-std-0001", region=region, start_time_ms=900, end_time_ms=4_000,
        resources=resources, error=error)
    doc = job_status(**facts)
    expected = job_completed(doc, instance_name="worker-std-0001", resources=resources,
                             start_reported=start_reported,
                             compact=compact_main(spec, outcomes, error))
    assert attempt_completed(**facts, start_reported=start_reported) == expected
