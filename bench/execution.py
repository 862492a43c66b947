"""Execution figures: no-op jobs per second end to end, beside this machine's process-spawn rate.

A private stack (as `make up` runs it: durable broker, projector, ingest, scheduler; the
scheduler starts local worker processes) runs a batch of ``n`` no-op jobs (``true``, a quarter
core each) submitted with the official client. The rate is jobs over the time from the client's
``submit()`` call to the batch's completion time as the API reports it; what the
client does before that call (start its interpreter, import hailtop, build the N job objects in
memory: ``client_start_seconds``) is the client's, not the system's, and is not counted. The
ceiling beside it is how fast this machine starts and reaps ``true`` processes with nothing else
to do, by the worker's own runtime, measured in the same run: every job costs at least one such
spawn.
``log_jobs_per_s`` is the rate read off the log itself (first SJ to last MJC of the batch): how
fast the scheduler and workers run jobs, before the projector makes completion visible to the
API; ``log_records`` counts the batch's records on the log by kind (how many jobs a record of
SJs or MJCs carried: the projector's cost a job moves with how they group, see
docs/performance.md, "Tried, and not kept", 2026-12-07 from 21:58). ``idle_cpu_ms_per_s`` is
what the stack costs doing nothing, watched for ``IDLE_S`` before the run: mostly consumers
polling the broker, which the run pays as well.
``cpu_ms_per_job_first_half`` and ``_second_half`` split the run's CPU at the moment half the jobs
had completed (the submission falls in the first half). The local broker's share grows from one
to the other: tansu walks every record batch stored in a partition on each fetch
(``../shared/kafka-broker.md``), and the batch's partition gains batches all through the run,
while Kafka finds a fetch's offset in an index.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa

from bench import cpu, process_start, remove_at_exit
from bench.ingest_throughput import _stack, _submit
from schemas.execution import JobCompleted, JobScheduled, JobsCompleted, JobsScheduled
from services.common import procs
from services.common.log import ConsumerOptions, LogConsumer, high_watermarks
from services.common.settings import LogSettings, load_settings
from services.stack.config import SEAWEED_PORT_SPAN, SERVICE_PORT_SPAN
from services.worker.runtime import FileLogSink, LocalProcessRuntime, RunRequest
from services.worker.spawner import Spawner

IDLE_S = 5.0
"""How long the stack is watched doing nothing, before the run."""


async def _spawn_rate(n: int, concurrency: int) -> float:
    """``true`` processes started and reaped per second with ``concurrency`` in flight, by the
    worker's own runtime (:class:`LocalProcessRuntime`, output to a log file made on its first
    byte as the worker's are, through the worker's process spawner where it is built), so the
    ceiling is what a no-op job costs the worker at least."""
    limit = asyncio.Semaphore(concurrency)
    runtime = LocalProcessRuntime()
    logs = Path(tempfile.mkdtemp(prefix="hs-bench-spawn-"))
    request = RunRequest(command=["true"], cwd=str(logs))

    async def one(i: int) -> None:
        async with limit:
            with FileLogSink.lazy(f"{logs}/{i % (2 * concurrency)}.log") as sink:
                outcome = await runtime.run(request, sink)
            if outcome.state != "Success":
                raise RuntimeError(f"`true` did not succeed: {outcome}")

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0)
    finally:
        Spawner.close_all()  # the runtime's process spawner, started for this loop
        shutil.rmtree(logs, ignore_errors=True)


def _status(url: str, token: str, batch_id: int) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/api/v1alpha/batches/{batch_id}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


async def _log_rate(log: LogSettings, batch_id: int
                    ) -> tuple[float, dict[str, float], dict[str, int]]:
    """Jobs per second of ``batch_id`` between its first SJ and its last MJC on the log, where
    an attempt's time went, by the times on the log and in the MJCs (:func:`_spans`), and how
    many records of each kind the batch's events took."""
    marks = await high_watermarks(log, ["batch-events"])
    first_sj, last_mjc, n = None, 0, 0
    kinds: collections.Counter[str] = collections.Counter()
    scheduled: dict[tuple[int, str], int] = {}
    # (SJ, attempt start, main container start, attempt end, MJC) times
    ended: list[tuple[int, int, int, int, int]] = []
    async with LogConsumer(log, ConsumerOptions(name="bench", topics=["batch-events"],
                                                group=False, max_records=10_000)) as consumer:
        done: dict[tuple[str, int], int] = {}
        while any(done.get(tp, 0) < end for tp, end in marks.items()):
            for rec in await consumer.next_batch():
                done[(rec.topic, rec.partition)] = rec.offset + 1
                event = rec.envelope.event
                if getattr(event, "batch_id", None) != batch_id:
                    continue
                kinds[type(event).__name__] += 1
                at = rec.envelope.time_ms
                if isinstance(event, JobScheduled | JobsScheduled):
                    first_sj = at if first_sj is None else first_sj
                    for sj in event.expand() if isinstance(event, JobsScheduled) else [event]:
                        scheduled[(sj.job_id, sj.attempt_id)] = at
                elif isinstance(event, JobCompleted | JobsCompleted):
                    mjcs = event.expand() if isinstance(event, JobsCompleted) else [event]
                    n += len(mjcs)
                    last_mjc = max(last_mjc, at)
                    ended += [(sj, mjc.start_time_ms, run, mjc.end_time_ms, at) for mjc in mjcs
                              if (sj := scheduled.get((mjc.job_id, mjc.attempt_id))) is not None
                              and mjc.start_time_ms is not None
                              and (run := _main_start(mjc)) is not None]
    rate = 0.0 if first_sj is None else n / max((last_mjc - first_sj) / 1000, 1e-3)
    return rate, _spans(ended, rate), dict(kinds)


class _Timing(msgspec.Struct):
    start_time: int


class _Main(msgspec.Struct):
    timing: dict[str, _Timing] = {}


class _Status(msgspec.Struct):
    container_statuses: dict[str, _Main] = {}


_status_doc = msgspec.json.Decoder(_Status)


def _main_start(mjc: JobCompleted) -> int | None:
    """When the main container's process was started: an MJC says it, or its status document
    does."""
    if mjc.main_start_ms is not None or mjc.status is None:
        return mjc.main_start_ms
    main = _status_doc.decode(mjc.status).container_statuses.get("main")
    running = None if main is None else main.timing.get("running")
    return None if running is None else running.start_time


def _spans(ended: list[tuple[int, int, int, int, int]], rate: float) -> dict[str, float]:
    """Mean milliseconds of an attempt from its SJ on the log to its start in the worker
    (delivery, the worker taking it up), from there to its process's start (the spec, the
    working directory, the log, the worker's queue), from there to its end (the process, its
    reaping), and from there to its MJC on the log (the outbox's linger, the publish);
    ``in_flight`` is how many attempts were between SJ and MJC on average (the rate times their
    mean sum, by Little's law). A slot's whole cycle is the worker's slots over the rate: what
    the spans leave of it is the scheduler's side (the MJC's fetch, the round that frees the
    slot and the next SJ's publish)."""
    if not ended:
        return {}
    k = len(ended)
    spans = {
        "sj_to_start": sum(start - sj for sj, start, _, _, _ in ended) / k,
        "start_to_process": sum(run - start for _, start, run, _, _ in ended) / k,
        "process_to_end": sum(end - run for _, _, run, end, _ in ended) / k,
        "end_to_mjc": sum(mjc - end for _, _, _, end, mjc in ended) / k,
    }
    spans = {name: round(ms, 1) for name, ms in spans.items()}
    spans["in_flight"] = round(rate * sum(spans.values()) / 1000, 1)
    return spans


def _per_job(spent: dict[str, Any]) -> dict[str, float]:
    figures = spent["cpu_ms_per_job"]
    assert isinstance(figures, dict)
    return figures


def run(n_jobs: int = 10_000, durable: bool = True) -> dict[str, Any]:
    spawn_1 = asyncio.run(_spawn_rate(1_000, 1))
    spawn_16 = asyncio.run(_spawn_rate(2_000, 16))
    starts = process_start.measure()
    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-exec-"))
    db_name = f"hs_bench_{uuid.uuid4().hex[:8]}"
    # A free block below the ephemeral range: a single free port's neighbours (the
    # services' other ports) may be any outgoing connection's by the time they bind.
    service_port = procs.free_port_block(SERVICE_PORT_SPAN)
    env = {**os.environ, "HS_DATA_DIR": str(tmp),
           "HS_KAFKA_BOOTSTRAP": f"127.0.0.1:{procs.free_port()}",
           "HS_STACK_SEAWEED_BASE_PORT": str(procs.free_port_block(SEAWEED_PORT_SPAN)),
           "HS_STACK_SERVICE_BASE_PORT": str(service_port),
           "HS_STACK_MODE": "durable" if durable else "memory", "HS_DB_NAME": db_name,
           "HS_SCHEDULER_AUTOSCALE_S": "1"}
    url = f"http://127.0.0.1:{service_port}"
    try:
        _stack(env, "up", "--quiet")
        token = (tmp / "dev-token").read_text().strip()
        warm = _submit(url, token, 100, "0.25")  # workers up before the clock starts
        while not _status(url, token, warm["id"])["complete"]:
            time.sleep(0.2)
        # What the stack costs doing nothing (consumers polling the broker, mostly), which
        # the run pays too: CPU ms per second per component.
        quiet = cpu.Window.of_stack(str(tmp))
        quiet.start()
        time.sleep(IDLE_S)
        idle = quiet.stop(IDLE_S, unit="s")
        window = cpu.Window.of_stack(str(tmp))
        window.start()
        # The same again per half of the run (by jobs completed): a component whose CPU per
        # job grows through the run costs more in the second (the local broker: see the
        # module's docstring).
        first_half = cpu.Window(window.marker, children=False)
        first_half.start()
        second_half = cpu.Window(window.marker, children=False)
        halves: dict[str, dict[str, float]] = {}
        half_done = 0
        launched = time.time()
        big = _submit(url, token, n_jobs, "0.25")
        while True:
            status = _status(url, token, big["id"])
            if status["complete"]:
                seen = time.time()  # the API reports it complete (polled every 0.5 s)
                break
            if not halves and n_jobs // 2 <= status["n_completed"] < n_jobs:
                half_done = status["n_completed"]
                halves["cpu_ms_per_job_first_half"] = _per_job(first_half.stop(half_done))
                second_half.start()
            time.sleep(0.5)  # polling is load on ingest and MariaDB: the end is read below
        # From the client's submit() call to the batch complete as the API reports it (the
        # projection's completion time, to the millisecond): the client's interpreter start,
        # hailtop's import and the N job objects it builds in memory come before.
        completed = datetime.strptime(status["time_completed"], "%Y-%m-%dT%H:%M:%S.%f%z")
        elapsed = completed.timestamp() - big["started_at"]
        spent = window.stop(n_jobs)
        if halves:
            halves["cpu_ms_per_job_second_half"] = _per_job(
                second_half.stop(n_jobs - half_done))
        log = load_settings(env).log
        log_rate, spans, records = asyncio.run(_log_rate(log, big["id"]))
        return {
            "storage": "seaweedfs" if durable else "memory",
            "jobs": n_jobs,
            "state": status["state"],
            "n_succeeded": status["n_succeeded"],
            "client_start_seconds": round(big["started_at"] - launched, 2),
            "submit_seconds": round(big["seconds"], 2),
            "end_to_end_seconds": round(elapsed, 2),
            "noop_jobs_per_s": round(n_jobs / elapsed, 1),
            # To the API reporting the batch complete: the projection caught up with the log.
            # The batch's completion time is its last MJC's; a projector that falls behind the
            # jobs (the local stack's runs at nice 15) shows it complete later.
            "visible_seconds": round(seen - big["started_at"], 2),
            "noop_jobs_per_s_visible": round(n_jobs / (seen - big["started_at"]), 1),
            "run_jobs_per_s_after_submit": round(n_jobs / max(elapsed - big["seconds"], 1e-9),
                                                 1),
            "log_jobs_per_s": round(log_rate, 1),
            "attempt_ms": spans,
            "log_records": records,
            "spawn_per_s_serial": round(spawn_1),
            "spawn_per_s_16_concurrent": round(spawn_16),
            **starts,
            **spent,
            **halves,
            "idle_cpu_ms_per_s": idle["cpu_ms_per_s"],
        }
    finally:
        _stack(env, "down")
        remove_at_exit(tmp)
        engine = sa.create_engine(load_settings().db.url(database=False))
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{db_name}`"))
        engine.dispose()
