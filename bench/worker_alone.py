"""The worker's own CPU a job, without the rest of the stack: ``python -m bench.worker_alone``.

End to end, the worker's share of a no-op job is a few percent of the machine's CPU and moves
with the hour, so a change of a few microseconds in its Python takes `bench.ab` pairs of minutes
each to see. This drives one :class:`~services.worker.service.Worker` in this process instead:
attempts delivered 64 at a time as a dispatch would (``_accept`` with an inline spec of ``true``),
each run to its end by the worker's own runtime and process spawner, its MJCs handed to an
outbox whose publisher keeps nothing (no broker: the log's cost is not the worker's). It prints
CPU microseconds a job of:

- ``worker_python_us``: this process (the worker's Python and its event loop);
- ``spawner_us``: the process spawner (``hs-spawner``), when the worker has one;
- ``children_us``: the jobs' own processes (the spawner's reaped children);

and ``jobs_per_s``. The event loop is the services' (uvloop by default, ``HS_EVENT_LOOP``), and
the collector is set as the services set it (``tune_for_service``). ``--profile`` prints the
worker's functions by their own time under ``cProfile`` (which inflates small calls; the
figures above are taken without it). The figures are this machine's at this minute: compare two
versions by running each a few times, interleaved (docs/performance.md, "The worker's own Python
a job").
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from schemas.base import AttemptResource
from schemas.events import AnyEvent
from services.common.eventloop import run, service_loop
from services.common.gcpause import tune_for_service
from services.common.settings import LogSettings
from services.worker.service import JobRequest, Worker, WorkerSettings
from services.worker.spawner import Spawner

DELIVERY = 64
"""Attempts a delivery: what the scheduler sends a worker in one request at full speed."""
WARMUP = 500
SPEC: dict[str, Any] = {"process": {"type": "docker", "image": "ubuntu:24.04",
                                    "command": ["true"]}}
RESOURCES = [AttemptResource(resource="compute/n1-preemptible/1", quantity=1000)]


class _Nowhere:
    """A publisher that takes every event and keeps none: the worker's side of publishing
    (the outbox, the bunching of MJCs) runs, the broker's does not."""

    async def publish_many(self, events: Sequence[AnyEvent]) -> None:
        return None

    async def stop(self) -> None:
        return None


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


async def _deliver(worker: Worker, first: int, n: int) -> None:
    """Attempts ``first`` .. ``first + n``, a delivery at a time, each delivery once the one
    before has ended (the worker's cores are many: none is refused)."""
    for lo in range(first, first + n, DELIVERY):
        tasks = []
        for job_id in range(lo, min(first + n, lo + DELIVERY)):
            status, body = worker._accept(JobRequest(
                batch_id=1, job_id=job_id, attempt_id="a1b2c3", user="bench", spec=SPEC,
                cores_mcpu=1000, resources=RESOURCES))
            task = worker._attempts[(1, job_id, "a1b2c3")].task
            if status != 200 or task is None:
                raise RuntimeError(f"the worker refused job {job_id}: {status} {body}")
            tasks.append(task)
        await asyncio.gather(*tasks)  # each ends once its MJC is published


async def measure(jobs: int, *, profile: bool = False) -> dict[str, float]:
    """Run ``jobs`` no-op attempts through one worker (after a warm-up); the figures above."""
    with tempfile.TemporaryDirectory(prefix="hs-bench-worker-") as tmp:
        settings = WorkerSettings(instance_name="bench-worker", port=0,
                                  cores_mcpu=1000 * 4 * DELIVERY, log_dir=f"{tmp}/logs",
                                  spec_dir=f"{tmp}/specs", scratch_dir=tmp)
        worker = Worker(settings, LogSettings(), publisher=_Nowhere())  # type: ignore[arg-type]
        try:
            await _deliver(worker, 0, WARMUP)
            spawner = Spawner._last  # the one this loop's runs started, if any
            spawner_pid = (spawner._proc.pid if spawner is not None and not spawner._closed
                           and spawner._loop is asyncio.get_running_loop() else None)
            before = _proc_cpu(spawner_pid) if spawner_pid is not None else (0.0, 0.0)
            profiler = cProfile.Profile() if profile else None
            cpu, wall = time.process_time(), time.perf_counter()
            if profiler is not None:
                profiler.enable()
            await _deliver(worker, WARMUP, jobs)
            if profiler is not None:
                profiler.disable()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            after = _proc_cpu(spawner_pid) if spawner_pid is not None else (0.0, 0.0)
        finally:
            Spawner.close_all()
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    figures = {"worker_python_us": cpu / jobs * 1e6, "jobs_per_s": jobs / wall}
    if spawner_pid is not None:
        figures["spawner_us"] = (after[0] - before[0]) / jobs * 1e6
        figures["children_us"] = (after[1] - before[1]) / jobs * 1e6
    return {key: round(value, 1) for key, value in figures.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_alone",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=8_000)
    parser.add_argument("--profile", action="store_true",
                        help="print the worker's functions by their own time (cProfile)")
    args = parser.parse_args(argv)
    factory = service_loop("bench.worker_alone")
    tune_for_service()
    print(run(measure(args.jobs, profile=args.profile), factory))


if __name__ == "__main__":
    main()
