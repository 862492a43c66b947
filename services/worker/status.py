"""The worker's status document of one attempt, and the MJC that carries it (pure).

The document has the reference worker's shape (status format version 5), because clients read it
as is under a job's ``status``::

    {version, worker, batch_id, job_id, attempt_id, user, state, format_version, resources,
     region, error?, start_time, end_time, timing,
     container_statuses: {input?, main, output?}}

``state`` is the worker's spelling (``succeeded``, ``failed``, ``error``, ``cancelled``); the API
state (``Success``...) travels in the MJC. ``container_statuses`` holds one entry per container
the spec implies: ``input`` only with ``input_files``, ``output`` only with ``output_files``;
a container that never ran (its input failed, say) is ``pending`` with empty timing. Each entry::

    {name, state, timing: {running: {start_time, finish_time, duration}}, error?, short_error?,
     container_status?: {state, started_at, finished_at, exit_code, out_of_memory}}

``container_status`` is present once a process ran to an exit (not for a cancelled one). The
API's ``exit_code`` is derived from the document by the reference's rule (:func:`api_exit_code`),
which clients also apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from schemas.base import AttemptResource, CompletedJobState
from schemas.execution import JobCompleted
from services.worker.runtime import Outcome

STATUS_FORMAT_VERSION: Final = 5
BATCH_FORMAT_VERSION: Final = 7
TASKS: Final = ("input", "main", "output")

WORKER_STATE: Final[Mapping[CompletedJobState, str]] = {
    "Success": "succeeded",
    "Failed": "failed",
    "Error": "error",
    "Cancelled": "cancelled",
}
API_STATE: Final[Mapping[str, CompletedJobState]] = {v: k for k, v in WORKER_STATE.items()}


def container_name(batch_id: int, job_id: int, task: str) -> str:
    """The reference's container name, e.g. ``batch-7-job-1-main``."""
    return f"batch-{batch_id}-job-{job_id}-{task}"


def spec_tasks(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The containers a job spec implies, in the order they run."""
    return tuple(t for t in TASKS
                 if t == "main" or spec.get(f"{t}_files"))


def runs_output(spec: Mapping[str, Any], main: Outcome) -> bool:
    """Whether the output container runs after ``main`` (``always_copy_output`` defaults on)."""
    return bool(spec.get("output_files")) and (
        main.state == "Success" or spec.get("always_copy_output", True) is not False)


def attempt_state(outcomes: Mapping[str, Outcome]) -> CompletedJobState:
    """The attempt's state from its containers' outcomes, by the reference's rule.

    A failed input decides; else a main that did not succeed decides; else the output, if it
    ran, decides; else the attempt succeeded.
    """
    for task in TASKS:
        outcome = outcomes.get(task)
        if outcome is not None and outcome.state != "Success":
            return outcome.state
    return "Success"


def container_status(name: str, outcome: Outcome | None) -> dict[str, Any]:
    """One entry of ``container_statuses``; None means the container never ran (pending)."""
    if outcome is None:
        return {"name": name, "state": "pending", "timing": {}}
    start, end = outcome.start_time_ms, outcome.end_time_ms
    doc: dict[str, Any] = {
        "name": name,
        "state": WORKER_STATE[outcome.state],
        "timing": {"running": {"start_time": start, "finish_time": end,
                               "duration": end - start}},
    }
    if outcome.error is not None:
        doc["error"] = outcome.error
    if outcome.short_error is not None:
        doc["short_error"] = outcome.short_error
    # As in the reference, a cancelled container reports no container status (so no exit code).
    if outcome.exit_code is not None and outcome.state != "Cancelled":
        doc["container_status"] = {
            "state": "finished",
            "started_at": start,
            "finished_at": end,
            "exit_code": outcome.exit_code,
            "out_of_memory": outcome.out_of_memory,
        }
    return doc


def job_status(
    *,
    spec: Mapping[str, Any],
    outcomes: Mapping[str, Outcome],
    batch_id: int,
    job_id: int,
    attempt_id: str,
    user: str,
    worker: str,
    region: str | None,
    start_time_ms: int,
    end_time_ms: int,
    resources: Iterable[AttemptResource] = (),
    error: str | None = None,
    timing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status document of one finished attempt.

    Args:
        spec: The job spec as submitted (decides which containers exist).
        outcomes: The outcome of each container that ran, by task name.
        batch_id: The batch.
        job_id: The job.
        attempt_id: The attempt.
        user: The batch's owner.
        worker: The instance name.
        region: The instance's region.
        start_time_ms: When the worker started the attempt.
        end_time_ms: When the attempt ended.
        resources: What the attempt is billed for.
        error: A worker-side failure outside any container (the attempt is then ``error``).
        timing: The attempt's own steps, ``{step: {start_time, finish_time, duration}}``.

    Returns:
        The document, JSON-ready.

    """
    state = "error" if error is not None else WORKER_STATE[attempt_state(outcomes)]
    doc: dict[str, Any] = {
        "version": STATUS_FORMAT_VERSION,
        "worker": worker,
        "batch_id": batch_id,
        "job_id": job_id,
        "attempt_id": attempt_id,
        "user": user,
        "state": state,
        "format_version": BATCH_FORMAT_VERSION,
        "resources": [{"name": r.resource, "quantity": r.quantity}
                      for r in sorted(resources, key=_by_name)],
        "region": region,
    }
    if error is not None:
        doc["error"] = error
    doc["start_time"] = start_time_ms
    doc["end_time"] = end_time_ms
    doc["container_statuses"] = {
        task: container_status(container_name(batch_id, job_id, task), outcomes.get(task))
        for task in spec_tasks(spec)
    }
    doc["timing"] = dict(timing or {})
    return doc


def api_exit_code(status: Mapping[str, Any] | None) -> int | None:
    """The job's exit code as the API and the client derive it from the status document.

    None when the attempt has a worker error; otherwise, over input, main, output in order:
    None at the first container without an exit code (an error, or it never ran), the first
    non-zero exit code, else 0.
    """
    if not status or status.get("error") is not None:
        return None
    statuses = status.get("container_statuses")
    if not statuses:
        return None
    for task in TASKS:
        if task not in statuses:
            continue
        entry = statuses[task] or {}
        if entry.get("error") is not None:
            return None
        code = (entry.get("container_status") or {}).get("exit_code")
        if code is None:
            return None
        if code > 0:
            return int(code)
    return 0


def status_error(status: Mapping[str, Any]) -> str | None:
    """The attempt's error for the MJC: the worker's, else the first container's, in task order."""
    if status.get("error") is not None:
        return str(status["error"])
    statuses = status.get("container_statuses") or {}
    for task in TASKS:
        entry = statuses.get(task) or {}
        if entry.get("error") is not None:
            return str(entry["error"])
    return None


def _by_name(resource: AttemptResource) -> str:
    return resource.resource


def compact_main(spec: Mapping[str, Any], outcomes: Mapping[str, Outcome],
                 error: str | None) -> Outcome | None:
    """The main container's outcome when the attempt's document follows from its MJC's facts
    (see :class:`JobCompleted`): the spec implies the main container alone, which ran to an
    exit with no error, no timeout and enough memory. None for any other attempt."""
    main = outcomes.get("main")
    if (error is not None or main is None or main.exit_code is None
            or main.state not in ("Success", "Failed") or main.error is not None
            or main.short_error is not None or main.timed_out or main.out_of_memory
            or len(outcomes) != 1 or spec_tasks(spec) != ("main",)):
        return None
    return main


def compact_status(*, batch_id: int, job_id: int, attempt_id: str, user: str, worker: str,
                   region: str | None, state: CompletedJobState, exit_code: int,
                   start_time_ms: int, end_time_ms: int, main_start_ms: int, main_end_ms: int,
                   resources: Iterable[AttemptResource] = ()) -> dict[str, Any]:
    """The status document of an attempt whose MJC carried none (:func:`compact_main`), from
    the MJC's facts: the document :func:`job_status` gave the worker for that attempt."""
    main = Outcome(state=state, exit_code=exit_code, start_time_ms=main_start_ms,
                   end_time_ms=main_end_ms)
    return job_status(spec={}, outcomes={"main": main}, batch_id=batch_id, job_id=job_id,
                      attempt_id=attempt_id, user=user, worker=worker, region=region,
                      start_time_ms=start_time_ms, end_time_ms=end_time_ms,
                      resources=resources)


def attempt_completed(
    *,
    spec: Mapping[str, Any],
    outcomes: Mapping[str, Outcome],
    batch_id: int,
    job_id: int,
    attempt_id: str,
    user: str,
    worker: str,
    region: str | None,
    start_time_ms: int,
    end_time_ms: int,
    resources: Iterable[AttemptResource] = (),
    error: str | None = None,
    start_reported: bool = True,
) -> JobCompleted:
    """The MJC of a finished attempt (the arguments are :func:`job_status`'s; ``worker`` is
    also the MJC's instance): the event :func:`job_completed` makes of its document, with
    ``compact`` as :func:`compact_main` finds it. The common attempt's MJC carries no
    document, so none is built for it: building and reading back the document it does not
    carry was about 18 us of a no-op job's worker (2026-12-08)."""
    main = compact_main(spec, outcomes, error)
    if main is None:
        doc = job_status(spec=spec, outcomes=outcomes, batch_id=batch_id, job_id=job_id,
                         attempt_id=attempt_id, user=user, worker=worker, region=region,
                         start_time_ms=start_time_ms, end_time_ms=end_time_ms,
                         resources=resources, error=error)
        return job_completed(doc, instance_name=worker, resources=resources,
                             start_reported=start_reported)
    # The facts job_completed reads back from the document of such an attempt: its state
    # and exit code are its main container's, and it has no error.
    assert main.exit_code is not None
    return JobCompleted(
        batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, instance_name=worker,
        state=main.state, exit_code=main.exit_code, start_time_ms=start_time_ms,
        end_time_ms=end_time_ms, resources=list(resources), start_reported=start_reported,
        main_start_ms=main.start_time_ms, main_end_ms=main.end_time_ms, region=region)


def job_completed(
    status: Mapping[str, Any],
    *,
    instance_name: str,
    resources: Iterable[AttemptResource] = (),
    start_reported: bool = True,
    compact: Outcome | None = None,
) -> JobCompleted:
    """The MJC of an attempt, from its status document (which it carries as JSON text).
    ``start_reported``: False if no MJS was published for the attempt. With ``compact`` (the
    main container's outcome, from :func:`compact_main`), the MJC carries the facts the
    document follows from instead of the document: its process's start and end, the region.

    A no-op job's document was about 600 bytes of every MJC, which the broker stored, the
    projector decoded and escaped, and MariaDB parsed and wrote into the job's row: without
    it, the stack's own CPU per job was 4.5% lower end to end (bench.ab, 2026-12-02), the
    database's alone about a fifth.
    """
    return JobCompleted(
        batch_id=status["batch_id"],
        job_id=status["job_id"],
        attempt_id=status["attempt_id"],
        instance_name=instance_name,
        state=API_STATE[status["state"]],
        exit_code=api_exit_code(status),
        error=status_error(status),
        start_time_ms=status.get("start_time"),
        end_time_ms=status["end_time"],
        resources=list(resources),
        status=None if compact is not None else msgspec.json.encode(status).decode(),
        start_reported=start_reported,
        main_start_ms=None if compact is None else compact.start_time_ms,
        main_end_ms=None if compact is None else compact.end_time_ms,
        region=status["region"],
    )
