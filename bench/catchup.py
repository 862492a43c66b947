"""Catch-up figures: how fast the projector applies a backlog of execution events.

End to end is judged to the batch shown complete, and the projector shows it well after the
last job's end when it fell behind through the run (docs/performance.md, "The projector's
tail"). This scenario measures that regime alone: the real projector process
(``python -m services.projector``, as the stack runs it, with the one-machine stack's fetch
wait) on a generated log (:mod:`bench.replay`'s batches, users and billed attempts). The
projector first applies the submissions; the execution events are then appended at once as
the live stack publishes a no-op job's (the SJs of ``bunch`` jobs as one ``JobsScheduled``,
their MJCs as one ``JobsCompleted``, no MJS; ``bunch`` 1: an SJ, MJS and MJC a job, as
:mod:`bench.replay`'s log has them), and the projector is started again on that backlog.
Timed from its first transaction on the backlog (its start and group join are not) to the
last offset applied, with the CPU of the projector and MariaDB in that window.

``python -m bench catchup`` (``--catchup-jobs``, 50,000 by default; ``--catchup-bunch``, 32).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import cpu, replay
from schemas.events import AnyEvent
from schemas.execution import (
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
)
from services.common import procs
from services.common.log import bootstrap_topics, delete_topics, high_watermarks
from services.common.settings import (
    ALL_TOPICS,
    LOCAL_BROKER_FETCH_MAX_WAIT_MS,
    DatabaseSettings,
    LogSettings,
    load_settings,
    log_env,
    projector_consumer,
)
from services.projector.app import PROJECTED_TOPICS
from sql.migrate import apply_migrations

EXECUTION = (JobScheduled, JobStarted, JobCompleted, JobsScheduled, JobsCompleted)
BUNCH = 32
"""Jobs a record of SJs or MJCs carries: in end to end, the projector's transactions of about
100 records held some 3,000 jobs."""
WORKERS = 8


def generate(n_jobs: int, batch_size: int, bunch: int = BUNCH, seed: int = 7,
             first_batch: int = 1) -> list[AnyEvent]:
    """The whole log in append order: :func:`bench.replay.generate`'s with the execution
    events of ``bunch`` jobs at a time as one record each of SJs and MJCs (``bunch`` 1: that
    log itself), its batches numbered from ``first_batch``."""
    if bunch == 1:
        if first_batch != 1:
            raise ValueError("bench.replay's log numbers its batches from 1")
        return replay.generate(n_jobs, batch_size, seed)
    rnd = random.Random(seed)
    events = replay.control_events()
    runs: list[list[AnyEvent]] = []
    for b, start in enumerate(range(0, n_jobs, batch_size), start=first_batch):
        sub, jobs = replay.submission(b, min(batch_size, n_jobs - start), rnd)
        events += sub
        parents = {p for j in jobs for p in j.parent_ids}
        run: list[AnyEvent] = []
        for i in range(0, len(jobs), bunch):
            worker = f"worker-{i // bunch % WORKERS:02d}"
            sjs, mjcs = [], []
            for job in jobs[i:i + bunch]:
                sj, _, mjc = replay.execution(b, job, rnd, replay.RESOURCES,
                                              may_fail=job.job_id not in parents)
                assert isinstance(sj, JobScheduled) and isinstance(mjc, JobCompleted)
                sjs.append(msgspec.structs.replace(sj, instance_name=worker))
                mjcs.append(msgspec.structs.replace(mjc, instance_name=worker))
            run += [JobsScheduled.of(b, sjs), JobsCompleted.of(mjcs)]
        runs.append(run)
    for i in range(max(map(len, runs), default=0)):
        events += [r[i] for r in runs if i < len(r)]
    return events
POLL_S = 0.02
TIMEOUT_S = 900.0


def _applied(engine: sa.Engine, consumer: str) -> int:
    with engine.connect() as conn:
        total = conn.execute(sa.text("SELECT COALESCE(SUM(next_offset), 0) FROM applied_offsets "
                                     "WHERE consumer = :c"), {"c": consumer}).scalar()
    return int(total or 0)


def _backlog_end(log: LogSettings) -> int:
    marks = asyncio.run(high_watermarks(log, PROJECTED_TOPICS))
    return sum(marks.values())


def _start(log: LogSettings, db: DatabaseSettings, data_dir: Path, marker: str,
           run: int) -> Any:
    env = {**os.environ, **log_env(log), "HS_DB_NAME": db.name, "HS_DATA_DIR": str(data_dir),
           "HS_KAFKA_FETCH_MAX_WAIT_MS": str(LOCAL_BROKER_FETCH_MAX_WAIT_MS),
           "HS_BENCH_MARKER": marker}
    log_path = data_dir / f"projector-{run}.log"
    proc = procs.spawn([sys.executable, "-m", "services.projector"], log_path=log_path, env=env)
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def _check(proc: Any) -> None:
    if proc.poll() is not None:
        tail = Path(proc.log_path).read_text()[-3000:]
        raise RuntimeError(f"the projector exited with {proc.returncode}:\n{tail}")


def _wait(engine: sa.Engine, consumer: str, end: int, proc: Any) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while _applied(engine, consumer) < end:
        _check(proc)
        if time.monotonic() > deadline:
            raise TimeoutError("the projector did not catch up")
        time.sleep(POLL_S)


def _stop(proc: Any) -> None:
    procs.terminate(proc.pid)
    proc.wait()


def run(bootstrap: str, n_jobs: int = 50_000, batch_size: int = 10_000, bunch: int = BUNCH
        ) -> dict[str, Any]:
    """Publish a generated log's submissions, let the projector apply them, then time its
    catch-up on the execution events appended behind it."""
    settings = load_settings()
    log = msgspec.structs.replace(settings.log, bootstrap_servers=bootstrap,
                                  topic_prefix=f"bench-catchup-{uuid.uuid4().hex[:8]}-")
    db = msgspec.structs.replace(settings.db, name=f"hs_bench_catchup_{uuid.uuid4().hex[:8]}")
    events = generate(n_jobs, batch_size, bunch)
    submissions = [e for e in events if not isinstance(e, EXECUTION)]
    execution = [e for e in events if isinstance(e, EXECUTION)]
    consumer = projector_consumer(log)
    asyncio.run(bootstrap_topics(log))
    apply_migrations(db)
    engine = sa.create_engine(db.url(), poolclass=NullPool)
    try:
        with tempfile.TemporaryDirectory(prefix="hs-catchup-") as tmp:
            data_dir, marker = Path(tmp), f"hs-catchup-{uuid.uuid4().hex}"
            asyncio.run(replay._publish(log, submissions))
            proc = _start(log, db, data_dir, marker, 1)
            try:
                _wait(engine, consumer, _backlog_end(log), proc)
                start = _applied(engine, consumer)
                publishing = threading.Thread(target=asyncio.run,
                                              args=(replay._publish(log, execution),))
                publishing.start()
                while (first := _applied(engine, consumer)) == start:
                    _check(proc)
                    time.sleep(POLL_S / 4)
                window = cpu.Window(f"HS_BENCH_MARKER={marker}".encode(), children=False)
                window.start()
                t0 = time.perf_counter()
                publishing.join()
                end = _backlog_end(log)
                _wait(engine, consumer, end, proc)
                seconds = time.perf_counter() - t0
                counted = end - first
                jobs = counted * n_jobs / (end - start)  # of the records timed
                spent = window.stop(round(jobs), unit="job")
            finally:
                _stop(proc)
        with engine.connect() as conn:
            done = conn.execute(sa.text("SELECT COUNT(*) FROM jobs WHERE state IN "
                                        "('Success', 'Failed')")).scalar()
        if done != n_jobs:
            raise AssertionError(f"the projector ended {done} of {n_jobs} jobs")
        return {"jobs": n_jobs, "jobs_a_record": bunch, "records_behind": end - start,
                "records_timed": counted, "catchup_seconds": round(seconds, 2),
                "catchup_records_per_s": round(counted / seconds),
                "catchup_jobs_per_s": round(jobs / seconds)} | spent
    finally:
        engine.dispose()
        with sa.create_engine(db.url(database=False), poolclass=NullPool).begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db.name}`")
        asyncio.run(delete_topics(log, ALL_TOPICS))
