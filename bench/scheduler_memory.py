"""Scheduler memory: what the scheduler's state holds per job of one big committed batch.

Folds a batch of ``n_jobs`` independent jobs (created, submitted in bunches of 10,000,
committed) into a :class:`core.scheduler_state.SchedulerState`, the scheduler's whole memory of
it, and measures the process's resident memory before and after (after a collection), so the
figure includes every allocation the fold made, not an estimate. Also reports how long the fold
took (a new leader rebuilds this from the log at start) and the bytes per job, and scales them
linearly to 10,000,000 jobs when run smaller.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from core.scheduler_state import SchedulerState
from schemas.base import JobResources
from schemas.batch import BatchCreated, JobRecord, JobsSubmitted, UpdateCommitted

BUNCH = 10_000
TARGET_JOBS = 10_000_000


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(n_jobs: int = 1_000_000) -> dict[str, Any]:
    gc.collect()
    before = _rss_bytes()
    state = SchedulerState()
    resources = JobResources(cores_mcpu=250, memory_bytes=1 << 30)
    t0 = time.perf_counter()
    state.apply(BatchCreated(batch_id=1, user="bench", billing_project="bench", token="t"))
    for start in range(1, n_jobs + 1, BUNCH):
        records = [JobRecord(job_id=j, job_group_id=0, parent_ids=[], always_run=False,
                             inst_coll="standard", spec="{}", resources=resources)
                   for j in range(start, min(start + BUNCH, n_jobs + 1))]
        state.apply(JobsSubmitted(batch_id=1, update_id=1, jobs=records))
    state.apply(UpdateCommitted(batch_id=1, update_id=1, n_jobs=n_jobs, n_job_groups=0))
    seconds = time.perf_counter() - t0
    gc.collect()
    used = _rss_bytes() - before
    ready = sum(len(q) for q in state.ready.values())
    if ready != n_jobs:
        raise AssertionError(f"{ready} of {n_jobs} jobs are ready after the commit")
    per_job = used / n_jobs
    return {
        "jobs": n_jobs,
        "fold_seconds": round(seconds, 2),
        "fold_jobs_per_s": round(n_jobs / seconds),
        "rss_bytes": used,
        "bytes_per_job": round(per_job, 1),
        "projected_gib_at_10m_jobs": round(per_job * TARGET_JOBS / 2**30, 2),
    }
