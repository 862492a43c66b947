"""Read operations: projections -> the API's status shapes. Every read checks visibility.

SQL lives in :mod:`services.ingest.store` and :mod:`services.ingest.query_sql`; this module only
assembles responses (and the state rules come from :mod:`core.status`). Container logs come from
the :class:`LogStore` the workers write to (the shared log root); handlers call these methods in
a worker thread, so reading a log file here never blocks the event loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, cast

from core.billing import msec_mcpu, resources_of_text
from core.errors import BadRequest, NotFound
from core.query import parse_batch_query, parse_job_query
from core.status import batch_state, duration_ms, format_time_ms, group_state, humanize_ms
from core.waiting import CANCELLED
from schemas.base import AttemptResource
from services.common.specstore import SpecStore
from services.ingest import query_sql
from services.ingest.store import Store
from services.worker.logstore import LogStore, valid_name
from services.worker.status import compact_status

_GROUP = (
    "SELECT g.job_group_id, g.attributes, g.state, g.time_created_ms, g.time_completed_ms, "
    "c.n_jobs, c.n_completed, c.n_succeeded, c.n_failed, c.n_cancelled, "
    "(SELECT COUNT(*) FROM job_groups_cancelled x WHERE x.batch_id = g.batch_id "
    " AND x.job_group_id = g.job_group_id) AS cancelled, g.parent_id "
    "FROM job_groups g JOIN job_group_job_counts c ON c.batch_id = g.batch_id "
    "AND c.job_group_id = g.job_group_id WHERE g.batch_id = :b AND g.committed ")
_COUNTS = ("SELECT n_jobs, n_completed, n_succeeded, n_failed, n_cancelled FROM "
           "job_group_job_counts WHERE batch_id = :b AND job_group_id = 0")
_GROUP_COST = ("SELECT r.resource, SUM(a.resource_usage), SUM(a.resource_usage * r.rate) FROM "
               "aggregated_job_group_resources a JOIN resources r ON r.resource = a.resource "
               "WHERE a.batch_id = :b AND a.job_group_id = :g GROUP BY r.resource "
               "ORDER BY r.resource")
_JOB = (
    "SELECT j.batch_id, j.job_id, j.job_group_id, j.state, j.exit_code, j.always_run, "
    "j.cores_mcpu, j.inst_coll, j.start_time_ms, j.end_time_ms, j.status, j.name, "
    "j.cancelled, j.attempt_id, j.instance_name, j.main_start_ms, j.main_end_ms, "
    "j.worker_region, a.resources AS attempt_resources, b.user, b.billing_project "
    "FROM jobs j JOIN batches b ON b.id = j.batch_id "
    "JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id "
    "LEFT JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id "
    "AND a.attempt_id = j.attempt_id "
    "WHERE j.batch_id = :b AND j.job_id = :j AND u.committed")
# Why a Ready job waits: its cancelled group (drained soon), else its own reason, else its
# queue's (core/waiting.py). Three primary-key lookups; the first that exists wins.
_WAITING = (
    "SELECT 0 AS pick, reason, NULL AS message, time_cancelled_ms AS since_ms "
    "FROM job_groups_cancelled WHERE batch_id = :b AND job_group_id = :g AND :cancellable "
    "UNION ALL SELECT 1, reason, message, since_ms FROM job_waiting_reasons "
    "WHERE batch_id = :b AND job_id = :j "
    "UNION ALL SELECT 2, reason, message, since_ms FROM user_waiting_reasons "
    "WHERE user = :u AND inst_coll = :ic ORDER BY pick LIMIT 1")
_WAITING_STATES = frozenset({"Ready", "Creating"})
_JOB_ATTRS = "SELECT attr_key, attr_value FROM job_attributes WHERE batch_id = :b AND job_id = :j"
_ATTEMPTS = ("SELECT attempt_id, instance_name, start_time_ms, end_time_ms, reason FROM attempts "
             "WHERE batch_id = :b AND job_id = :j ORDER BY start_time_ms, attempt_id")


def _status_doc(r: Any) -> dict[str, Any] | None:
    """The job's status document: as its MJC carried it, else rendered from the facts a
    compact MJC carried (:class:`schemas.execution.JobCompleted`), else None (not ended)."""
    if r.status:
        return cast(dict[str, Any], json.loads(r.status))
    if r.main_start_ms is None or r.state not in ("Success", "Failed"):
        return None
    resources = [AttemptResource(resource=name, quantity=quantity) for name, quantity
                 in resources_of_text(r.attempt_resources).items()]
    return compact_status(
        batch_id=int(r.batch_id), job_id=int(r.job_id), attempt_id=str(r.attempt_id),
        user=str(r.user), worker=str(r.instance_name), region=r.worker_region,
        state=r.state, exit_code=int(r.exit_code), start_time_ms=int(r.start_time_ms),
        end_time_ms=int(r.end_time_ms), main_start_ms=int(r.main_start_ms),
        main_end_ms=int(r.main_end_ms), resources=resources)


def _now() -> int:
    return time.time_ns() // 1_000_000


def _cost(rows: Any) -> tuple[float, list[dict[str, Any]]]:
    breakdown = [{"resource": str(r), "cost": float(c or 0)} for r, _, c in rows]
    return float(sum((Decimal(str(c or 0)) for _, _, c in rows), Decimal(0))), breakdown


def _attributes(text: str | None) -> dict[str, str]:
    return json.loads(text) if text else {}


def batch_status(row: Any, counts: Any, cost_rows: Any) -> dict[str, Any]:
    """A batch's status from its row, its root counts and its cost rows."""
    n_jobs, n_completed, n_succeeded, n_failed, n_cancelled = (int(v or 0) for v in counts)
    complete = row.state == "complete"
    committed = row.state != "open"
    cost, breakdown = _cost(cost_rows)
    dur = (row.time_completed_ms - row.time_created_ms) if complete and row.time_completed_ms \
        else None
    out: dict[str, Any] = {
        "id": int(row.id), "user": row.user, "billing_project": row.billing_project,
        "token": row.token,
        "state": batch_state(committed=committed, n_failed=n_failed,
                             cancelled=bool(row.cancelled), complete=complete),
        "complete": complete, "closed": committed, "n_jobs": int(row.n_jobs),
        "n_completed": n_completed, "n_succeeded": n_succeeded, "n_failed": n_failed,
        "n_cancelled": n_cancelled,
        "time_created": format_time_ms(row.time_created_ms),
        "time_closed": format_time_ms(row.time_closed_ms),
        "time_completed": format_time_ms(row.time_completed_ms),
        "duration_ms": dur, "duration": humanize_ms(dur),
        "msec_mcpu": msec_mcpu({str(r): int(u or 0) for r, u, _ in cost_rows}),
        "cost": cost, "cost_breakdown": breakdown,
    }
    attrs = _attributes(row.attributes)
    if attrs:
        out["attributes"] = attrs
    assert n_jobs >= 0
    return out


def attempt_entry(r: Any) -> dict[str, Any]:
    """One attempt as the API shows it."""
    dur = None if r.start_time_ms is None or r.end_time_ms is None else \
        r.end_time_ms - r.start_time_ms
    return {"attempt_id": r.attempt_id, "instance_name": r.instance_name,
            "start_time": format_time_ms(r.start_time_ms), "start_time_ms": r.start_time_ms,
            "end_time": format_time_ms(r.end_time_ms), "end_time_ms": r.end_time_ms,
            "duration": humanize_ms(dur), "duration_ms": dur, "reason": r.reason}


class Reads:
    """The read side of the API for one store."""

    def __init__(self, store: Store, logs: LogStore | None = None,
                 specs: SpecStore | None = None) -> None:
        self.store = store
        # None: no log storage is reachable, so no job shows a log.
        self.logs = logs
        # None: no spec storage (ingest stores none either), so no job shows its spec.
        self.specs = specs

    def _spec(self, batch_id: int, job_id: int) -> dict[str, Any] | None:
        """The job's spec as submitted, from the spec store (ingest wrote it there before the
        job was on the log, so a visible job has one wherever specs are stored)."""
        text = None if self.specs is None else self.specs.read(batch_id, job_id)
        return None if text is None else dict(json.loads(text))

    def _batch_row(self, batch_id: int, user: str) -> Any:
        row = self.store.visible_batch(batch_id, user)
        if row is None:
            raise NotFound(f"batch {batch_id} not found")
        return row

    def batch(self, batch_id: int, user: str) -> dict[str, Any]:
        row = self._batch_row(batch_id, user)
        counts = self.store.one(_COUNTS, b=batch_id) or (0, 0, 0, 0, 0)
        stmt, params = query_sql.cost_breakdown_query(batch_id)
        cost_rows = [(r.resource, r.resource_usage, r.cost) for r in self.store.rows(
            stmt, **params)]
        return batch_status(row, counts, cost_rows)

    def batches(self, user: str, q: str | None, version: int,
                last_batch_id: int | None) -> dict[str, Any]:
        filters = parse_batch_query(q, 2 if version == 2 else 1, user=user)
        stmt, params = query_sql.batch_list_query(user, filters, last_batch_id=last_batch_id)
        rows = self.store.rows(stmt, **params)
        page, last = query_sql.batch_page(rows, lambda r: int(r.id))
        costs = self._costs_by(query_sql.batch_costs_query([int(r.id) for r in page]),
                               "batch_id")
        out: dict[str, Any] = {"batches": [
            batch_status(r, (r.n_jobs, r.n_completed, r.n_succeeded, r.n_failed,
                             r.n_cancelled), costs.get(int(r.id), [])) for r in page]}
        if last is not None:
            out["last_batch_id"] = last
        return out

    def _require_group(self, batch_id: int, group_id: int, user: str) -> None:
        """404 unless the batch is visible and the group is committed (cheap: no counts)."""
        self._batch_row(batch_id, user)
        if self.store.one("SELECT 1 FROM job_groups WHERE batch_id = :b AND job_group_id = :g "
                          "AND committed", b=batch_id, g=group_id) is None:
            raise NotFound(f"job group {group_id} not found")

    def group(self, batch_id: int, group_id: int, user: str) -> dict[str, Any]:
        self._batch_row(batch_id, user)
        row = self.store.one(_GROUP + "AND g.job_group_id = :g", b=batch_id, g=group_id)
        if row is None:
            raise NotFound(f"job group {group_id} not found")
        return self._group_status(batch_id, row)

    def _group_status(self, batch_id: int, row: Any) -> dict[str, Any]:
        complete = row.state == "complete"
        cost, breakdown = _cost(self.store.rows(_GROUP_COST, b=batch_id, g=row.job_group_id))
        dur = duration_ms(row.time_created_ms, row.time_completed_ms, _now())
        out: dict[str, Any] = {
            "batch_id": batch_id, "job_group_id": int(row.job_group_id),
            "state": group_state(n_failed=int(row.n_failed), cancelled=bool(row.cancelled),
                                 complete=complete),
            "complete": complete, "n_jobs": int(row.n_jobs),
            "n_completed": int(row.n_completed), "n_succeeded": int(row.n_succeeded),
            "n_failed": int(row.n_failed), "n_cancelled": int(row.n_cancelled),
            "time_created": format_time_ms(row.time_created_ms),
            "time_completed": format_time_ms(row.time_completed_ms),
            "duration": dur, "cost": cost, "cost_breakdown": breakdown,
        }
        attrs = _attributes(row.attributes)
        if attrs:
            out["attributes"] = attrs
        return out

    def child_groups(self, batch_id: int, group_id: int, user: str,
                     last_group_id: int | None) -> dict[str, Any]:
        self._require_group(batch_id, group_id, user)
        rows = self.store.rows(
            _GROUP + "AND g.parent_id = :g AND g.job_group_id > :after "
            "ORDER BY g.job_group_id LIMIT 51", b=batch_id, g=group_id,
            after=last_group_id or 0)
        out: dict[str, Any] = {"job_groups": [self._group_status(batch_id, r)
                                              for r in rows[:50]]}
        if len(rows) > 50:
            out["last_job_group_id"] = int(rows[49].job_group_id)
        return out

    def jobs(self, batch_id: int, group_id: int, user: str, q: str | None, version: int,
             last_job_id: int | None, recursive: bool) -> dict[str, Any]:
        self._require_group(batch_id, group_id, user)
        filters = parse_job_query(q or "", 2 if version == 2 else 1)
        stmt, params = query_sql.job_list_query(batch_id, group_id, recursive=recursive,
                                                filters=filters, last_job_id=last_job_id)
        page, last = query_sql.job_page(self.store.rows(stmt, **params),
                                        lambda r: int(r.job_id))
        costs = self._costs_by(query_sql.cost_breakdown_query(
            batch_id, [int(r.job_id) for r in page]), "job_id")
        out: dict[str, Any] = {"jobs": [self._job_entry(r, costs.get(int(r.job_id), []))
                                        for r in page]}
        if last is not None:
            out["last_job_id"] = last
        return out

    def _costs_by(self, query: tuple[Any, dict[str, Any]], key: str
                  ) -> dict[int, list[tuple[str, int, Any]]]:
        """Cost rows (resource, usage, cost) grouped by the ``key`` column."""
        out: dict[int, list[tuple[str, int, Any]]] = {}
        for r in self.store.rows(query[0], **query[1]):
            out.setdefault(int(getattr(r, key)), []).append(
                (str(r.resource), int(r.resource_usage), r.cost))
        return out

    @staticmethod
    def _job_entry(r: Any, cost_rows: Sequence[tuple[str, int, Any]] = ()) -> dict[str, Any]:
        cost, breakdown = _cost(cost_rows)
        return {
            "batch_id": int(r.batch_id), "job_id": int(r.job_id), "name": getattr(r, "name", None),
            "user": r.user, "billing_project": r.billing_project, "state": r.state,
            "exit_code": r.exit_code, "end_time": format_time_ms(r.end_time_ms),
            "duration": duration_ms(r.start_time_ms, r.end_time_ms, _now()),
            "cost": cost, "msec_mcpu": msec_mcpu({res: u for res, u, _ in cost_rows}),
            "cost_breakdown": breakdown,
            "always_run": bool(r.always_run), "display_state": None,
        }

    def job(self, batch_id: int, job_id: int, user: str) -> dict[str, Any]:
        self._batch_row(batch_id, user)
        r = self.store.one(_JOB, b=batch_id, j=job_id)
        if r is None:
            raise NotFound(f"job {batch_id}.{job_id} not found")
        attrs = {k: v for k, v in self.store.rows(_JOB_ATTRS, b=batch_id, j=job_id)}
        if r.name is not None:  # a column of the job's row (sql/013), not an attribute row
            attrs["name"] = r.name
        stmt, params = query_sql.cost_breakdown_query(batch_id, [job_id])
        cost_rows = [(str(c.resource), int(c.resource_usage), c.cost)
                     for c in self.store.rows(stmt, **params)]
        out = {**self._job_entry(r, cost_rows), "name": attrs.get("name"),
               "status": _status_doc(r),
               "spec": self._spec(batch_id, job_id), "inst_coll": r.inst_coll,
               "waiting_reason": self._waiting_reason(r)}
        if attrs:
            out["attributes"] = attrs
        return out

    def _waiting_reason(self, r: Any) -> dict[str, Any] | None:
        """Why a job waiting to be scheduled is not running yet; None for any other job."""
        if r.state not in _WAITING_STATES:
            return None
        if r.cancelled and not r.always_run:
            return {"reason": CANCELLED, "message": "a parent job failed; the job waits to be "
                    "drained by the canceller", "since": None, "since_ms": None}
        w = self.store.one(_WAITING, b=r.batch_id, j=r.job_id, g=r.job_group_id,
                           cancellable=not r.always_run, u=r.user, ic=r.inst_coll)
        if w is None:
            return None
        if w.pick == 0:
            return {"reason": CANCELLED, "message": f"the job's batch or job group was "
                    f"cancelled ({w.reason}); the job waits to be drained by the canceller",
                    "since": format_time_ms(w.since_ms), "since_ms": int(w.since_ms)}
        return {"reason": str(w.reason), "message": str(w.message),
                "since": format_time_ms(w.since_ms), "since_ms": int(w.since_ms)}

    def attempts(self, batch_id: int, job_id: int, user: str) -> list[dict[str, Any]] | None:
        self.job(batch_id, job_id, user)
        rows = self.store.rows(_ATTEMPTS, b=batch_id, j=job_id)
        return [attempt_entry(r) for r in rows] or None

    def _log_bytes(self, batch_id: int, job_id: int, attempt_id: str, container: str, *,
                   started: bool) -> bytes | None:
        """The log's bytes; none stored for the main container of a ``started`` attempt is
        an empty log (a worker makes the file on the first byte), else None."""
        if self.logs is None or not valid_name(attempt_id):
            return None
        data = self.logs.read(batch_id, job_id, attempt_id, container)
        return b"" if data is None and started and container == "main" else data

    def log(self, batch_id: int, job_id: int, user: str) -> dict[str, str | None]:
        """The job's container logs (text) of its latest attempt: ``main``, plus ``input`` /
        ``output`` when the spec has files. A container without a log (the job has not run, or
        not that far) is null; the main log of a started attempt that wrote nothing (no file
        is made for it) is empty."""
        spec = self.job(batch_id, job_id, user)["spec"] or {}
        containers = ["main"]
        if spec.get("input_files"):
            containers.append("input")
        if spec.get("output_files"):
            containers.append("output")
        latest = self.store.latest_attempt(batch_id, job_id)
        out: dict[str, str | None] = {}
        for container in containers:
            data = None if latest is None else self._log_bytes(
                batch_id, job_id, latest[0], container, started=latest[1])
            out[container] = None if data is None else data.decode("utf-8", errors="replace")
        return out

    def resource_usage(self, batch_id: int, job_id: int, user: str) -> dict[str, Any]:
        """Measured usage per section (input/main/output) as ``{columns, data}`` tables.

        Only attempts that ran are measured: a job that has not run has no sections.
        """
        self.attempts(batch_id, job_id, user)
        return {}

    def container_log(self, batch_id: int, job_id: int, container: str, user: str,
                      attempt_id: str | None) -> bytes:
        """One container's raw log, of ``attempt_id`` or else of the latest attempt."""
        if container not in ("input", "main", "output"):
            raise BadRequest(f"unknown container {container!r}: expected input, main or output")
        attempts = self.attempts(batch_id, job_id, user) or []
        if attempt_id is not None and attempt_id not in {a["attempt_id"] for a in attempts}:
            raise NotFound(f"job {batch_id}.{job_id} has no attempt {attempt_id}")
        if not attempts:
            raise NotFound(f"job {batch_id}.{job_id} has no {container} log: it has not run")
        if attempt_id is not None:
            started = any(a["attempt_id"] == attempt_id and a["start_time_ms"] is not None
                          for a in attempts)
            chosen: tuple[str, bool] | None = (attempt_id, started)
        else:
            chosen = self.store.latest_attempt(batch_id, job_id)
        data = None if chosen is None else self._log_bytes(batch_id, job_id, chosen[0],
                                                           container, started=chosen[1])
        if data is None:
            raise NotFound(f"job {batch_id}.{job_id} has no {container} log: "
                           f"none was stored for attempt {chosen[0] if chosen else None}")
        return data

    def require_int(self, value: str | None, what: str) -> int | None:
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise BadRequest(f"{what} must be an integer, not {value!r}") from None

