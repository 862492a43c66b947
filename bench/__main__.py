"""Run benchmarks: ``python -m bench [log] [ingest] [--events N] [--jobs N] [--bootstrap ...]``.

``log``: envelopes through the log adapter. Without ``--bootstrap`` it starts its own broker:
tansu in memory, or on SeaweedFS with ``--durable``, on free ports, and stops it afterwards.
``ingest``: a private full stack; a batch of ``--jobs`` submitted with the official client, and
batch and job-group status latency (``--submit-only``: the submit alone). ``execution``: a
private full stack runs ``--exec-jobs`` no-op jobs end to end, beside the machine's
process-spawn rate. Both stacks' broker keeps the log on SeaweedFS as ``make up`` does, or in
memory with ``--stack memory``. ``replay``: a
generated log of ``--replay-jobs`` jobs replayed into a fresh database as the audit's rebuild does.
``scheduler-memory``: the scheduler's state of one committed batch of ``--sched-jobs`` jobs.
``catchup`` (only when named): the projector applying a backlog of ``--catchup-jobs`` jobs'
execution events, as it does behind a run of no-op jobs (``bench/catchup.py``).
With no scenario named, all but ``catchup`` run. Prints a table per scenario, the machine's
speed during the run (``bench/machine.py``: this VM's speed varies by the hour, and the rates
with it), then every performance target of issue 6 with the figure that judges it and whether
it is met (``bench/targets.py``), and writes the same as JSON to bench/results/.
``--cpu-quota CORES`` runs it all on a slower machine made on demand (``bench/cpuquota.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from bench import (
    catchup,
    cpu,
    execution,
    ingest_throughput,
    log_throughput,
    machine,
    provenance,
    replay,
    scheduler_memory,
    stop_on_signals,
    targets,
)
from bench.cpuquota import QuotaError, cpu_quota
from services.common import procs
from services.common.settings import load_settings
from services.stack.components import seaweed_component
from services.stack.config import SEAWEED_PORT_SPAN, load_config


def _broker(stack: ExitStack, durable: bool) -> str:
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hs-bench-")))
    env: dict[str, str] = {}
    storage = "memory://tansu/"
    if durable:
        # The stack's own SeaweedFS command, on a free block: every port explicit (weed's
        # default gRPC ports are its HTTP ports + 10000, past 65535 for high free ports).
        cfg = load_config({"HS_DATA_DIR": str(tmp), "HS_STACK_SEAWEED_BASE_PORT":
                           str(procs.free_port_block(SEAWEED_PORT_SPAN))})
        weed = procs.spawn(seaweed_component(cfg).argv, log_path=tmp / "weed.log")
        stack.callback(weed.wait)  # callbacks run last-in first-out: terminate, then wait
        stack.callback(procs.terminate, weed.pid)
        s3 = cfg.stack.seaweed_port("s3")
        procs.wait_for_port(s3, timeout=60, proc=weed, what="seaweedfs")
        deadline = time.monotonic() + 60
        while not procs.s3_bucket_ready(s3):
            if time.monotonic() > deadline:
                raise TimeoutError("seaweedfs did not create the tansu bucket")
            time.sleep(0.2)
        storage, env = "s3://tansu/", procs.s3_env(s3)
    port = procs.free_port()
    tansu = procs.spawn(procs.tansu_command(port, storage), log_path=tmp / "tansu.log", env=env)
    stack.callback(tansu.wait)
    stack.callback(procs.terminate, tansu.pid)
    procs.wait_for_port(port, timeout=30, proc=tansu, what="tansu")
    return f"127.0.0.1:{port}"


def _speed(sampler: machine.Sampler, t0: float, until: float = float("inf"),
           suffix: str = "during") -> dict[str, float | int]:
    """The machine's speed during the scenario (or the step of one) from ``t0`` to ``until``:
    the CPU-bound figures move with it, and a run's other scenarios may have run at another."""
    got = sampler.since(t0, until)
    return {f"{name}_{suffix}": got[name] for name in (
        "python_mops_median", "python_mops_p10", "memory_msteps_median", "memory_msteps_p10")
        if name in got}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenarios", nargs="*",
                        help="log, ingest, execution, replay, scheduler-memory (default: all "
                             "of these), catchup")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)  # the target's batch
    parser.add_argument("--exec-jobs", type=int, default=100_000)  # the target's batch
    parser.add_argument("--replay-jobs", type=int, default=100_000)  # ~300,000 events
    parser.add_argument("--replay-modes", choices=("all", "default"), default="all",
                        help="replay: the rebuild's default lanes only (as bench.ab --scenario "
                             "replay runs it), or also one lane and the sink's lanes (all)")
    parser.add_argument("--sched-jobs", type=int, default=10_000_000)
    parser.add_argument("--catchup-jobs", type=int, default=50_000)
    parser.add_argument("--catchup-bunch", type=int, default=catchup.BUNCH,
                        help="catchup: jobs a record of SJs or MJCs carries (1: an SJ, MJS "
                             "and MJC a job)")
    parser.add_argument("--submit-only", action="store_true",
                        help="ingest: only the big submit and its CPU (no client alone, status "
                             "reads or cancel), as bench.ab --scenario ingest runs it")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--durable", action="store_true", help="own broker on SeaweedFS")
    parser.add_argument("--stack", choices=("durable", "memory"), default="durable",
                        help="the ingest and execution stacks' broker storage: SeaweedFS, as "
                             "`make up` runs it (default), or memory")
    parser.add_argument("--cpu-quota", type=float, metavar="CORES",
                        help="hold the whole run, and the machine's MariaDB, to this many "
                             "cores of CPU (a cgroup's quota, bench.cpuquota): a slow hour on "
                             "demand; the figures and targets are then that machine's")
    args = parser.parse_args()
    stop_on_signals()
    held = ExitStack()  # the CPU quota, left when the run ends
    if args.cpu_quota is not None:
        try:
            held.enter_context(cpu_quota(args.cpu_quota))
        except QuotaError as e:
            parser.error(str(e))
    with held:
        _run(args, parser)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    known = ["log", "ingest", "execution", "replay", "scheduler-memory"]
    scenarios = args.scenarios or known
    unknown = set(scenarios) - {*known, "catchup"}
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}: choose from {', '.join(known)}")
    results: dict[str, dict[str, object]] = {}
    run = provenance.run_info(Path(__file__).resolve().parent.parent, sys.argv[1:], time.time())
    # Marks the brokers this run starts, so the CPU they spend is counted (bench/cpu.py).
    os.environ["HS_BENCH_RUN"] = run_id = uuid.uuid4().hex
    marker = f"HS_BENCH_RUN={run_id}".encode()
    sampler = machine.Sampler()
    sampler.start()
    booted = machine.uptime_s()
    if "log" in scenarios:
        settings = load_settings().log
        with ExitStack() as stack:
            bootstrap = args.bootstrap or _broker(stack, args.durable)
            settings = msgspec.structs.replace(settings, bootstrap_servers=bootstrap)
            storage = "external" if args.bootstrap else (
                "seaweedfs" if args.durable else "memory")
            window = cpu.Window(marker, own="client (aiokafka)")
            window.start()
            figures = log_throughput.main(settings, args.events)
            # Each event is published once and read back once; the broker's share of that is
            # what every event of the system costs it at least (most are read by 2 consumers).
            spent = window.stop(int(figures["events"]), unit="event_published_and_read")
            results["log"] = {"storage": storage, **figures, **spent}
    if "ingest" in scenarios:
        t0 = time.monotonic()
        results["ingest"] = ingest_throughput.run(args.jobs, durable=args.stack == "durable",
                                                  submit_only=args.submit_only)
        results["ingest"] |= _speed(sampler, t0)
        # The scenario also runs the client alone, status reads and a cancel: the submit's
        # own window says whether the submit itself ran at a slow minute.
        window = results["ingest"].pop("submit_window_monotonic", None)
        if isinstance(window, list):
            results["ingest"] |= _speed(sampler, *window, suffix="during_submit")
    if "execution" in scenarios:
        t0 = time.monotonic()
        results["execution"] = execution.run(args.exec_jobs,
                                                 durable=args.stack == "durable")
        results["execution"] |= _speed(sampler, t0)
    if "replay" in scenarios:
        t0 = time.monotonic()
        with ExitStack() as stack:
            modes = replay.modes_now()
            modes = modes if args.replay_modes == "all" else modes[:1]
            results["replay"] = replay.run(args.bootstrap or _broker(stack, args.durable),
                                           args.replay_jobs, marker=marker, modes=modes)
        results["replay"] |= _speed(sampler, t0)
    if "catchup" in scenarios:
        t0 = time.monotonic()
        with ExitStack() as stack:
            results["catchup"] = catchup.run(args.bootstrap or _broker(stack, args.durable),
                                             args.catchup_jobs, bunch=args.catchup_bunch)
        results["catchup"] |= _speed(sampler, t0)
    if "scheduler-memory" in scenarios:
        results["scheduler-memory"] = scheduler_memory.run(args.sched_jobs)
    speed: dict[str, float | int | str] = {**sampler.stop(), "python": machine.interpreter()}
    if booted is not None:
        speed["uptime_s_at_start"] = round(booted)
    if args.cpu_quota is not None:
        speed["cpu_quota_cores"] = args.cpu_quota
    for name, figures in [*results.items(), ("machine", speed)]:
        table = Table(title=name)
        table.add_column("figure")
        table.add_column("value", justify="right")
        for key, value in figures.items():
            table.add_row(key, str(value))
        Console().print(table)
    assessed = targets.assess({**results, "machine": speed})
    table = Table(title="targets")
    for column in ("figure", "measured", "target", "met", "note"):
        table.add_column(column, justify="right" if column == "measured" else "left")
    for a in assessed:
        table.add_row(a.figure, a.measured, a.target,
                      "-" if a.target == targets.DIAGNOSTIC else "not measured" if a.met is None
                      else "yes" if a.met else "NO", a.note)
    Console().print(table)
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{'-'.join(results)}-{time.strftime('%Y%m%dT%H%M%S')}.json"
    report = {"run": run, **results, "machine": speed,
              "targets": [dataclasses.asdict(a) for a in assessed]}
    path.write_text(json.dumps(report, indent=2) + "\n")
    dirty = " with uncommitted changes" if run["dirty"] else ""
    print(f"code: {run['commit'] or 'not a git checkout'}{dirty}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
