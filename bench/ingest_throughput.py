"""Ingest figures: job specs accepted per second for a big batch submitted with the official
client, and batch and job-group status latency at 1,000 and at N jobs.

A private stack (its own data dir, free ports, its own database; durable broker by default,
as `make up` runs it) is started with the stack CLI and stopped afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import cpu, remove_at_exit
from core.completions import parse_time
from schemas.batch import BatchCancelled
from schemas.execution import JobScheduled, JobsScheduled
from services.audit.history import load_batch
from services.common import procs
from services.common.settings import load_settings
from services.stack.config import SEAWEED_PORT_SPAN, SERVICE_PORT_SPAN

REPO = Path(__file__).resolve().parents[1]
HAIL_PYTHON = REPO / ".venv-hail" / "bin" / "python"


def _stack(env: dict[str, str], *args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "services.stack", *args], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:  # what the stack said, not only its exit code
        raise RuntimeError(f"`python -m services.stack {' '.join(args)}` exited with code "
                           f"{out.returncode}:\n{out.stdout}{out.stderr}")


def _submit(url: str, token: str, n: int, cpu: str | None = None) -> dict[str, Any]:
    out = subprocess.run([str(HAIL_PYTHON), str(REPO / "bench" / "hail_submit.py"), url, token,
                          "dev", str(n), *([cpu] if cpu else [])], capture_output=True, text=True,
                         timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the hailtop submission failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _latency_ms(url: str, token: str, paths: Sequence[str], n: int = 400
                ) -> list[list[float]]:
    """Latencies of ``n`` GETs of each path (under ``/api/v1alpha``), in rounds of one request
    per path, so that the k-th of every path is measured under the same load (the big batch's
    jobs run meanwhile)."""
    requests = [urllib.request.Request(f"{url}/api/v1alpha/{path}",
                                       headers={"Authorization": f"Bearer {token}"})
                for path in paths]
    samples: list[list[float]] = [[] for _ in paths]
    for _ in range(n):
        for req, out in zip(requests, samples, strict=True):
            t0 = time.perf_counter()
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
            out.append((time.perf_counter() - t0) * 1000)
    return samples


def latency_figures(samples: Sequence[float]) -> dict[str, float]:
    """Median and 95th percentile of latencies."""
    ordered = sorted(samples)
    return {"median": round(statistics.median(ordered), 2),
            "p95": round(ordered[int(0.95 * len(ordered)) - 1], 2)}


def paired_ratio(big: Sequence[float], small: Sequence[float]) -> float:
    """The median, over rounds, of one round's latency of ``big`` over that of ``small``.

    The machine's load moves the latency of both reads of a round alike (both cores are busy
    running the big batch's jobs, and a read's median there is several times its cost at rest),
    so the ratio of the two medians moved by up to a quarter from run to run; each round's own
    ratio leaves that shared load out.
    """
    if len(big) != len(small) or not big:
        raise ValueError("paired latencies need the same number of samples, at least one")
    return round(statistics.median(b / a for b, a in zip(big, small, strict=True)), 3)


def _get(url: str, token: str, batch_id: int) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/api/v1alpha/batches/{batch_id}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def _until(check: Any, within_s: float = 600.0) -> float:
    """Seconds until ``check()`` holds (polled every 10 ms)."""
    t0 = time.perf_counter()
    while not check():
        if time.perf_counter() - t0 > within_s:
            raise TimeoutError(f"not reached within {within_s} s")
        time.sleep(0.01)
    return time.perf_counter() - t0


def _cancel(url: str, token: str, batch_id: int) -> dict[str, Any]:
    """How long cancelling the batch takes: until ingest answers, and until the projection
    shows it cancelled. Ingest answers once the projector applied the cancel (read-your-writes,
    bounded by HS_INGEST_WAIT_S), which moves the batch's ready and running cores out of the
    fair-share counters in the same transaction; the scheduler folds the same event."""
    req = urllib.request.Request(f"{url}/api/v1alpha/batches/{batch_id}/cancel", data=b"",
                                 method="PATCH", headers={"Authorization": f"Bearer {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
    answered = time.perf_counter() - t0
    _until(lambda: _get(url, token, batch_id)["state"] == "cancelled")
    return {"answered_ms": round(answered * 1000, 1),
            "applied_ms": round((time.perf_counter() - t0) * 1000, 1)}


def _scheduling_stopped(env: dict[str, str], batch_id: int) -> dict[str, Any]:
    """From the batch's log: the SJs the scheduler appended after the BatchCancelled, and how
    long after it the last of them came (0 when none): scheduling stopped within that."""
    entries = asyncio.run(load_batch(load_settings(env).log, batch_id))
    cancel = next(e for e in entries if isinstance(e.envelope.event, BatchCancelled))
    after = [e.envelope.time_ms for e in entries
             if e.offset > cancel.offset and e.topic == cancel.topic
             and isinstance(e.envelope.event, JobScheduled | JobsScheduled)]
    return {"sj_after_cancel": len(after),
            "scheduling_stopped_within_ms": max(after, default=cancel.envelope.time_ms)
            - cancel.envelope.time_ms}


def _drained(url: str, token: str, batch_id: int, within_s: float = 900.0) -> float:
    """Seconds until the batch is complete, polled every 200 ms (a status read every 10 ms
    would load ingest while it drains)."""
    t0 = time.perf_counter()
    while not _get(url, token, batch_id)["complete"]:
        if time.perf_counter() - t0 > within_s:
            raise TimeoutError(f"batch {batch_id} not complete within {within_s} s")
        time.sleep(0.2)
    return time.perf_counter() - t0


CLIENT_PACKAGES = ("hail", "orjson", "aiohttp")
"""Whose versions the figures record: the client's time depends on them (docs/performance.md:
orjson 3.12 and later made the 1M-job submit's client part 2-4 s slower here)."""


def client_versions() -> dict[str, str]:
    """The versions of :data:`CLIENT_PACKAGES` in the client's venv."""
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))")
    out = subprocess.run([str(HAIL_PYTHON), "-c", code, *CLIENT_PACKAGES], capture_output=True,
                         text=True, timeout=60, check=True)
    return dict(json.loads(out.stdout))


def client_alone(n: int, tmp: Path) -> dict[str, Any]:
    """The same submission against a server that answers at once (bench/null_server.py):
    what the official client alone needs, the floor under any server's figure."""
    port = procs.free_port()
    server = procs.spawn([sys.executable, "-m", "bench.null_server", str(port)],
                         log_path=tmp / "null-server.log", cwd=REPO)
    try:
        procs.wait_for_port(port, timeout=30, proc=server, what="the null server")
        out = _submit(f"http://127.0.0.1:{port}", "none", n)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/created", timeout=10) as r:
            out["created_at"] = json.load(r)["created_at"]
        return out
    finally:
        procs.terminate(server.pid)
        server.wait()


def _submit_figures(n_jobs: int, durable: bool, big: dict[str, Any], created_ms: int | None,
                    visible: float) -> dict[str, Any]:
    """The big submit's own figures: its time, the client's CPU, the server's part (from the
    batch's creation, hailtop's first request, to the commit's answer)."""
    out: dict[str, Any] = {
        "storage": "seaweedfs" if durable else "memory",
        "jobs": n_jobs,
        "submit_seconds": round(big["seconds"], 2),
        "job_specs_per_s": round(n_jobs / big["seconds"]),
        "client_cpu_seconds": round(big["cpu_seconds"], 2),
        "commit_visible_after_submit_s": round(visible, 2),
    }
    # hailtop serializes every spec and cuts the bunches before its first request (the
    # batch's creation): only the rest of the submission is the server's.
    if created_ms is not None:
        before = created_ms / 1000 - big["started_at"]
        out["client_before_first_request_s"] = round(before, 2)
        out["submit_after_first_request_s"] = round(big["seconds"] - before, 2)
    return out


def run(n_jobs: int = 100_000, durable: bool = True, submit_only: bool = False
        ) -> dict[str, Any]:
    """The scenario's figures. ``submit_only``: the big submit and its CPU alone (no client
    alone, status reads or cancel), for comparing versions of the submit (bench.ab)."""
    if not HAIL_PYTHON.exists():
        raise SystemExit("the official client is missing: run `make venv-hail`")
    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-ingest-"))
    # First, on the idle machine: the client's own ceiling for the same batch.
    alone = {} if submit_only else client_alone(n_jobs, tmp)
    db_name = f"hs_bench_{uuid.uuid4().hex[:8]}"
    # A free block below the ephemeral range: a single free port's neighbours (the
    # services' other ports) may be any outgoing connection's by the time they bind.
    service_port = procs.free_port_block(SERVICE_PORT_SPAN)
    env = {**os.environ, "HS_DATA_DIR": str(tmp),
           "HS_KAFKA_BOOTSTRAP": f"127.0.0.1:{procs.free_port()}",
           "HS_STACK_SEAWEED_BASE_PORT": str(procs.free_port_block(SEAWEED_PORT_SPAN)),
           "HS_STACK_SERVICE_BASE_PORT": str(service_port),
           "HS_STACK_MODE": "durable" if durable else "memory", "HS_DB_NAME": db_name}
    url = f"http://127.0.0.1:{service_port}"
    try:
        _stack(env, "up", "--quiet")
        token = (tmp / "dev-token").read_text().strip()
        small = _submit(url, token, 1_000)
        # Its jobs run on the stack's workers: done before the window opens, or their CPU
        # would count as the big submission's.
        _until(lambda: _get(url, token, small["id"])["complete"])
        window = cpu.Window(f"HS_DATA_DIR={tmp}".encode(), children=False)
        window.start()
        submit_started = time.monotonic()
        big = _submit(url, token, n_jobs)
        submit_ended = time.monotonic()
        # Ingest answers a write after at most HS_INGEST_WAIT_S even if the projection has
        # not caught up: status and cancel are measured once the commit is visible.
        visible = _until(lambda: _get(url, token, big["id"])["closed"])
        created_ms = parse_time(_get(url, token, big["id"])["time_created"])
        spent = window.stop(n_jobs, extra={"client (hailtop)": big["cpu_seconds"]})
        if submit_only:
            return _submit_figures(n_jobs, durable, big, created_ms, visible) | {
                "submit_window_monotonic": [submit_started, submit_ended]} | spent
        # The batch's status, and its root job group's (the group holding every job; any
        # group's status is read the same way).
        reads = _latency_ms(url, token, [
            f"batches/{small['id']}", f"batches/{big['id']}",
            f"batches/{small['id']}/job-groups/0", f"batches/{big['id']}/job-groups/0"])
        out: dict[str, Any] = _submit_figures(n_jobs, durable, big, created_ms, visible) | {
            "client_alone_seconds": round(alone["seconds"], 2),
            "client_alone_cpu_seconds": round(alone["cpu_seconds"], 2),
            "client_versions": client_versions(),
            "submit_1000_seconds": round(small["seconds"], 2),
            "status_ms_at_1000_jobs": latency_figures(reads[0]),
            f"status_ms_at_{n_jobs}_jobs": latency_figures(reads[1]),
            f"status_paired_ratio_at_{n_jobs}_jobs": paired_ratio(reads[1], reads[0]),
            "group_status_ms_at_1000_jobs": latency_figures(reads[2]),
            f"group_status_ms_at_{n_jobs}_jobs": latency_figures(reads[3]),
            f"group_status_paired_ratio_at_{n_jobs}_jobs": paired_ratio(reads[3], reads[2]),
            # For the machine's speed during the submit (bench/__main__.py takes it out).
            "submit_window_monotonic": [submit_started, submit_ended],
        }
        if alone.get("created_at") is not None:
            out["client_alone_before_first_request_s"] = round(
                alone["created_at"] - alone["started_at"], 2)
        cancelled = _cancel(url, token, big["id"])
        time.sleep(3)  # SJs the scheduler had in flight reach the log
        cancelled |= _scheduling_stopped(env, big["id"])
        # The canceller then ends every Ready job (Cancelled), a round at a time: until the
        # batch is complete (the seconds since the cancel was answered).
        cancelled["drained_s"] = round(
            cancelled["answered_ms"] / 1000 + 3 + _drained(url, token, big["id"]), 1)
        return out | {f"cancel_{k}_at_{n_jobs}_jobs": v for k, v in cancelled.items()} | spent
    finally:
        _stack(env, "down")
        remove_at_exit(tmp)
        engine = sa.create_engine(load_settings().db.url(database=False))
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{db_name}`"))
        engine.dispose()
