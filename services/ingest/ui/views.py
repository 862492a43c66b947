"""View models: the API's read results shaped for the templates (no SQL, no HTML).

Each function takes what the read repositories return (the same dicts the REST API answers)
and returns plain data the templates render; they run in a worker thread with the reads.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from core.query import QueryVersion, default_batch_query, render_query
from core.status import format_time_ms, humanize_ms
from services.ingest.reads import Reads
from services.ingest.store import User

MAX_TREE_GROUPS: Final = 500


@dataclass
class GroupNode:
    """One job group of a batch's tree, with its status and children."""

    status: dict[str, Any]
    children: list[GroupNode] = field(default_factory=list)

    @property
    def name(self) -> str:
        attrs = self.status.get("attributes") or {}
        return str(attrs.get("name", ""))


def usd(value: Any) -> str:
    """Dollars with enough places for the tiny costs of short jobs."""
    if value is None:
        return "-"
    v = float(value)
    if v == 0 or v >= 0.01:
        return f"${v:,.2f}"
    # three significant digits, however small: a short job costs a fraction of a micro-dollar
    places = min(15, 2 - math.floor(math.log10(abs(v))))
    return f"${v:.{places}f}"


def time_ms(value: int | None) -> str:
    return format_time_ms(value) or "-"


def duration(ms: int | None) -> str:
    return humanize_ms(ms) or "-"


def ago_ms(value: int | None, now_ms: int) -> str:
    if value is None:
        return "-"
    seconds = max(0, now_ms - value) // 1000
    if seconds < 3600:
        return f"{seconds} s ago"
    return (humanize_ms(seconds * 1000) or "") + " ago"


def query_version(raw: str | None) -> QueryVersion:
    return 1 if raw == "1" else 2


def batch_query_text(q: str | None, version: QueryVersion, user: str) -> str:
    """The text the query box shows: what was asked, or the default filter written out."""
    if q is not None:
        return q
    return render_query(default_batch_query(user), version)


def group_tree(reads: Reads, batch_id: int, user: str) -> tuple[GroupNode, bool]:
    """The batch's job groups as a tree from the root group, and whether it was cut short
    (at :data:`MAX_TREE_GROUPS` groups); children come from the same paged read as the API's."""
    root = GroupNode(reads.group(batch_id, 0, user))
    frontier = [root]
    seen = 1
    while frontier:
        node = frontier.pop(0)
        last: int | None = None
        while True:
            page = reads.child_groups(batch_id, int(node.status["job_group_id"]), user, last)
            for status in page["job_groups"]:
                if seen >= MAX_TREE_GROUPS:
                    return root, True
                child = GroupNode(status)
                node.children.append(child)
                frontier.append(child)
                seen += 1
            last = page.get("last_job_group_id")
            if last is None:
                break
    return root, False


def cancellable(batch: Mapping[str, Any]) -> bool:
    return not batch["complete"] and batch["state"] not in ("cancelled",)


def spec_summary(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Image, command and resources of a job spec, for people."""
    process = spec.get("process") or {}
    command = process.get("command") or []
    resources = spec.get("resources") or {}
    return {
        "type": process.get("type", "docker"),
        "image": process.get("image") or process.get("jar_spec", {}).get("value"),
        "command": " ".join(str(c) for c in command) if isinstance(command, list)
        else str(command),
        "cpu": resources.get("cpu"), "memory": resources.get("memory"),
        "storage": resources.get("storage"), "machine_type": resources.get("machine_type"),
        "preemptible": resources.get("preemptible"),
        "timeout": spec.get("timeout"), "always_run": spec.get("always_run", False),
        "n_max_attempts": spec.get("n_max_attempts"),
        "env": [e.get("name") for e in spec.get("env") or [] if isinstance(e, dict)],
    }


def job_error(job: Mapping[str, Any]) -> str | None:
    status = job.get("status") or {}
    main = (status.get("container_statuses") or {}).get("main") or {}
    return status.get("error") or main.get("error") or main.get("short_error")


def waiting_reason(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The scheduler's "why not running" note, when the job status carries one."""
    reason = job.get("waiting_reason")
    if not isinstance(reason, Mapping):
        return None
    since = reason.get("since")
    return {"reason": reason.get("reason"), "message": reason.get("message"),
            "since": format_time_ms(since) if isinstance(since, int) else since}


def job_page(reads: Reads, batch_id: int, job_id: int, user: str) -> dict[str, Any]:
    """Everything the job page shows, from the API's job, attempts and log reads."""
    job = reads.job(batch_id, job_id, user)
    attempts = reads.attempts(batch_id, job_id, user) or []
    logs = reads.log(batch_id, job_id, user)
    return {"job": job, "spec": spec_summary(job.get("spec") or {}),
            "attempts": attempts, "logs": logs, "error": job_error(job),
            "waiting": waiting_reason(job)}


def daily_totals(rows: list[Any]) -> list[tuple[str, float]]:
    """Total cost per day of :class:`services.ingest.spending.DailyCost` rows, newest first."""
    totals: dict[str, float] = {}
    for r in rows:
        totals[r.day] = totals.get(r.day, 0.0) + r.cost
    return sorted(totals.items(), reverse=True)


def visible_users(user: User, spent: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Cost per user over all projects (one row for a non-developer: themselves)."""
    totals: dict[str, float] = {}
    for s in spent:
        totals[s["user"]] = totals.get(s["user"], 0.0) + float(s["total_spent"])
    if not user.is_developer:
        totals.setdefault(user.name, 0.0)
    return sorted(totals.items())


def today_utc() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()
