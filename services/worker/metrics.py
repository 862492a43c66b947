"""The worker's metrics: MJS and MJC published, MJS left to the MJC, running attempts, and
spawn latency.

A worker serves them on its own HTTP port (``GET /metrics``), beside the dispatch API.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Counter

from schemas.events import AnyEvent
from schemas.execution import JobCompleted, JobsCompleted, JobStarted
from services.common.metrics import counter, gauge, histogram

MJS_PUBLISHED = counter("hs_worker_mjs_published", "Job starts (MJS events) the log accepted.")
MJS_COALESCED = counter(
    "hs_worker_mjs_coalesced",
    "Attempts that ended before their MJS was due: their MJC alone reported the start.")
MJC_PUBLISHED = counter("hs_worker_mjc_published",
                        "Job completions (MJC events) the log accepted, by final state.",
                        ["state"])
RUNNING = gauge("hs_worker_running_attempts",
                "Attempts this worker holds (accepted and not yet reported).")
SPAWN_SECONDS = histogram(
    "hs_worker_spawn_seconds",
    "From accepting a dispatch to the job's process starting (spec read, workdir, log).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))

_by_state: dict[str, Counter] = {}


def holding(task: asyncio.Task[None]) -> None:
    """The worker holds an attempt until ``task`` ends."""
    RUNNING.inc()
    task.add_done_callback(_released)


def _released(task: asyncio.Task[None]) -> None:
    RUNNING.dec()


def reported(event: AnyEvent) -> None:
    """``event`` was published (MJS and MJC are counted; other events are not)."""
    if isinstance(event, JobStarted):
        MJS_PUBLISHED.inc()
    elif isinstance(event, JobCompleted):
        _completed(event.state)
    elif isinstance(event, JobsCompleted):
        for a in event.attempts:
            _completed(a.state)


def _completed(state: str) -> None:
    child = _by_state.get(state)
    if child is None:
        child = _by_state[state] = MJC_PUBLISHED.labels(state)
    child.inc()


def start_coalesced() -> None:
    """An attempt ended before its MJS was due: its MJC alone reports its start."""
    MJS_COALESCED.inc()


def spawned(accepted_ms: int, started_ms: int) -> None:
    """An attempt accepted at ``accepted_ms`` started its process at ``started_ms``."""
    SPAWN_SECONDS.observe(max(0, started_ms - accepted_ms) / 1000)
