"""The performance targets (issue 6) against what a run of ``python -m bench`` measured.

Each target names the scenario figure it is judged by. A figure measured at a smaller scale than
the target's (``--jobs``, ``--exec-jobs``) is shown with its scale and judged as measured (a
rate) or extrapolated linearly (a duration), and says so; a target no scenario measures yet is
reported as not measured, never as met.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.machine import FRESH_BOOT_S


@dataclass(frozen=True)
class Assessment:
    figure: str
    measured: str
    target: str
    met: bool | None
    """None: not measured in this run."""
    note: str = ""


DIAGNOSTIC = "(diagnostic)"
"""The target of a row that is context for the others, judged by nothing."""


def _get(results: Mapping[str, Mapping[str, Any]], scenario: str, key: str) -> Any:
    return results.get(scenario, {}).get(key)


def _cpu_note(results: Mapping[str, Mapping[str, Any]], scenario: str, unit: str,
              prefix: str = "") -> str:
    """The CPU a unit of work cost in all, its biggest consumer, and the rate that implies
    with the whole machine on it (bench/cpu.py)."""
    total = _get(results, scenario, f"{prefix}cpu_ms_per_{unit}_total")
    per = _get(results, scenario, f"{prefix}cpu_ms_per_{unit}") or {}
    ceiling = _get(results, scenario, f"{prefix}ceiling_per_s")
    if total is None or not per:
        return ""
    top = max(per, key=per.get)
    speed = _get(results, scenario, "python_mops_median_during")
    memory = _get(results, scenario, "memory_msteps_median_during")
    return (f"; CPU {total} ms/{unit} (most: {top} {per[top]} ms) -> at most {ceiling}/s "
            f"with every core on it"
            + ("" if speed is None else f" (machine speed during it: probe median {speed}"
               + ("" if memory is None else f", memory probe median {memory}") + ")"))


def _outside_floor(results: Mapping[str, Mapping[str, Any]], scenario: str,
                   components: tuple[str, ...]) -> str:
    """What the components outside this project's code (the official client, the broker) cost
    per job in the same run, and the 1M-job time that alone implies with every core on it."""
    per = _get(results, scenario, "cpu_ms_per_job") or {}
    if not all(c in per for c in components):
        return ""
    ms = sum(per[c] for c in components)
    cores = _get(results, scenario, "cores") or os.cpu_count() or 1
    return (f"; {' + '.join(components)} alone: {ms:.3f} ms/job -> at least "
            f"{ms * 1_000_000 / 1000 / cores:.1f} s for 1,000,000 jobs on {cores} cores, "
            f"were ingest, projector and MariaDB free")


def _status_ratio(results: Mapping[str, Mapping[str, Any]], n: int | None, prefix: str,
                  what: str) -> Assessment:
    """A status read's latency at ``n`` jobs over its latency at 1,000: the median of the
    reads' ratios round by round (:func:`bench.ingest_throughput.paired_ratio`), or of their
    medians where a run has no paired figure."""
    figure = f"{what} status latency, 1M vs 1k jobs"
    small = _get(results, "ingest", f"{prefix}status_ms_at_1000_jobs")
    big = _get(results, "ingest", f"{prefix}status_ms_at_{n}_jobs") if n else None
    if small is None or big is None or n is None:
        return Assessment(figure, "-", "<= 1.2x", None)
    paired = _get(results, "ingest", f"{prefix}status_paired_ratio_at_{n}_jobs")
    of_medians = big["median"] / small["median"]
    ratio = of_medians if paired is None else paired
    note = f"median {big['median']} ms at {n:,} jobs vs {small['median']} ms at 1,000"
    if paired is not None:
        note = f"median of the rounds' ratios; {note} ({of_medians:.2f}x)"
    return Assessment(figure, f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2 and n >= 1_000_000,
                      note + ("" if n >= 1_000_000 else "; the target's batch is 1M"))


def _start_note(results: Mapping[str, Mapping[str, Any]]) -> str:
    """What one start of ``true`` costs this machine (bench/process_start.py), if measured."""
    true = _get(results, "execution", "start_cpu_us_true")
    bare = _get(results, "execution", "start_cpu_us_no_libc")
    if true is None or bare is None:
        return ""
    cpuid = _get(results, "execution", "cpuid_us")
    return (f"; one start of `true` costs {true / 1000:.3f} ms of CPU here, a program without "
            f"a C library {bare / 1000:.3f}"
            + ("" if cpuid is None else f" (one `cpuid`, which glibc's start runs dozens of "
               f"times, {cpuid} µs)"))


def assess(results: Mapping[str, Mapping[str, Any]]) -> list[Assessment]:
    """Every target, judged from ``results`` (scenario -> figures) where they have the figure."""
    out: list[Assessment] = []
    completed = _get(results, "execution", "noop_jobs_per_s")
    visible = _get(results, "execution", "noop_jobs_per_s_visible")
    # Judged to the API reporting the batch complete where the run measured it (the lower).
    rate = completed if visible is None else min(completed, visible)
    jobs = _get(results, "execution", "jobs")
    spawn = _get(results, "execution", "spawn_per_s_16_concurrent")
    if rate is None:
        out.append(Assessment("no-op jobs/s end to end", "-", ">= 1000 (100,000 jobs)", None))
    else:
        note = f"at {jobs:,} jobs"
        if visible is not None:
            note += (f", to the API reporting the batch complete; {completed}/s to its "
                     f"completion time (its last MJC)")
        note += f"; process-spawn ceiling {spawn}/s (16 concurrent)"
        note += _start_note(results)
        note += _cpu_note(results, "execution", "job")
        if jobs < 100_000:
            note += "; the target's batch is 100,000"
        out.append(Assessment("no-op jobs/s end to end", f"{rate}", ">= 1000 (100,000 jobs)",
                              rate >= 1000 and jobs >= 100_000, note))
    log_rate = _get(results, "execution", "log_jobs_per_s")
    if log_rate is not None:
        note = "scheduler + workers, without the projector"
        spans = _get(results, "execution", "attempt_ms")
        if spans:
            note += (f"; an attempt's mean ms from its SJ to its start in the worker "
                     f"{spans['sj_to_start']}, to its process's start "
                     f"{spans['start_to_process']}, to its end {spans['process_to_end']}, to "
                     f"its MJC {spans['end_to_mjc']}; {spans['in_flight']} attempts in flight")
        out.append(Assessment("no-op jobs/s on the log (first SJ to last MJC)", f"{log_rate}",
                              DIAGNOSTIC, None, note))
    seconds = _get(results, "ingest", "submit_seconds")
    n = _get(results, "ingest", "jobs")
    if seconds is None:
        out.append(Assessment("1,000,000-job submit (hailtop)", "-", "< 20 s", None))
    else:
        projected = seconds * 1_000_000 / n
        note = "" if n == 1_000_000 else f"{seconds} s for {n:,} jobs, scaled linearly"
        note += _cpu_note(results, "ingest", "job")
        note += _outside_floor(results, "ingest", ("client (hailtop)", "broker (tansu)"))
        client_s = _get(results, "ingest", "client_cpu_seconds")
        if client_s is not None:
            # The official client submits from one asyncio thread: its own CPU bounds the
            # submission's wall time whatever the server does.
            note += f"; the official client's own CPU, one thread: {client_s:.1f} s"
            if n != 1_000_000:
                note += f" for {n:,} jobs ({client_s * 1_000_000 / n:.1f} s scaled to 1M)"
        alone_s = _get(results, "ingest", "client_alone_seconds")
        if alone_s is not None:
            # The same submission against a server that answers at once: no server can make
            # this client finish sooner on this machine.
            note += (f"; the same client against a server that answers at once: "
                     f"{alone_s:.1f} s")
            if n != 1_000_000:
                note += f" ({alone_s * 1_000_000 / n:.1f} s scaled to 1M)"
        before_s = _get(results, "ingest", "client_before_first_request_s")
        after_s = _get(results, "ingest", "submit_after_first_request_s")
        if before_s is not None and after_s is not None:
            # hailtop serializes every spec before its first request: the server's share of
            # the wall time is what follows that request.
            note += (f"; the client sent its first request {before_s:.1f} s into the submit "
                     f"(serializing every spec first), the server's part took {after_s:.1f} s")
        during = _get(results, "ingest", "python_mops_median_during_submit")
        if during is not None:
            memory = _get(results, "ingest", "memory_msteps_median_during_submit")
            note += (f"; machine speed during the submit itself: probe median {during}"
                     + ("" if memory is None else f", memory probe median {memory}"))
        out.append(Assessment("1,000,000-job submit (hailtop)", f"{projected:.1f} s", "< 20 s",
                              projected < 20, note.removeprefix("; ")))
    for prefix, what in (("", "batch"), ("group_", "job-group")):
        out.append(_status_ratio(results, n, prefix, what))
    cancel_ms = _get(results, "ingest", f"cancel_applied_ms_at_{n}_jobs") if n else None
    if cancel_ms is None:
        out.append(Assessment("1,000,000-job batch cancelled", "-", "<= 1 s", None))
    else:
        answered = _get(results, "ingest", f"cancel_answered_ms_at_{n}_jobs")
        stopped = _get(results, "ingest", f"cancel_scheduling_stopped_within_ms_at_{n}_jobs")
        worst = max(cancel_ms, stopped or 0)
        out.append(Assessment(
            "1,000,000-job batch cancelled", f"{worst / 1000:.3f} s", "<= 1 s",
            worst <= 1000 and stopped is not None and n >= 1_000_000,
            f"at {n:,} jobs: the projection showed it cancelled (counters moved in the same "
            f"transaction) after {cancel_ms} ms, ingest answered after {answered} ms; the "
            f"last SJ after the cancel came {stopped} ms after it; every job ended (the batch "
            f"complete) {_get(results, 'ingest', f'cancel_drained_s_at_{n}_jobs')} s after it"
            + ("" if n >= 1_000_000 else "; the target's batch is 1M")))
    replay_rate = _get(results, "replay", "replay_events_per_s")
    out.append(Assessment(
        "replay/rebuild events/s", "-" if replay_rate is None else f"{replay_rate}",
        ">= 50,000", None if replay_rate is None else replay_rate >= 50_000,
        "" if replay_rate is None else
        f"{_get(results, 'replay', 'events')} events; write statements/event "
        f"{_get(results, 'replay', 'write_statements_per_event')}"
        + _cpu_note(results, "replay", "event", prefix="replay_")
        + ("" if _get(results, "replay", "copy_floor_events_per_s_2_cores") is None else
           f"; MariaDB copying the replayed rows server-side: "
           f"{_get(results, 'replay', 'copy_floor_events_per_s_2_cores')} events/s on 2 cores")
        + ("" if _get(results, "replay", "no_fold_ceiling_events_per_s") is None else
           f"; reading the log and writing the rows as bulk lanes do, no fold at "
           f"all: at most {_get(results, 'replay', 'no_fold_ceiling_events_per_s')} events/s "
           f"with every core on it")))
    gib = _get(results, "scheduler-memory", "projected_gib_at_10m_jobs")
    sched_jobs = _get(results, "scheduler-memory", "jobs")
    if gib is None:
        out.append(Assessment("scheduler memory for 10,000,000 jobs", "-", "< 4 GiB", None))
    else:
        out.append(Assessment(
            "scheduler memory for 10,000,000 jobs", f"{gib} GiB", "< 4 GiB", gib < 4,
            f"resident memory of the folded state at {sched_jobs:,} jobs"
            + ("" if sched_jobs >= 10_000_000 else ", scaled linearly")))
    median = _get(results, "machine", "python_mops_median")
    if median is not None:
        out.append(Assessment(
            "machine speed (pure-Python probe, M iterations/s)", f"{median}", DIAGNOSTIC, None,
            f"median of {_get(results, 'machine', 'samples')} samples over the run, 10th-90th "
            f"percentile {_get(results, 'machine', 'python_mops_p10')}-"
            f"{_get(results, 'machine', 'python_mops_p90')}: this VM's speed varies by the "
            "hour and the CPU-bound rates above move with it (bench/machine.py)"
            + (f"; Python {python}" if (python := _get(results, "machine", "python")) else "")))
    memory = _get(results, "machine", "memory_msteps_median")
    if memory is not None:
        out.append(Assessment(
            "memory latency (16 MiB read chain, M steps/s)", f"{memory}", DIAGNOSTIC, None,
            f"10th-90th percentile {_get(results, 'machine', 'memory_msteps_p10')}-"
            f"{_get(results, 'machine', 'memory_msteps_p90')}: what the VM's neighbours leave "
            "of the shared cache and memory, which the probe above does not see"))
    quota = _get(results, "machine", "cpu_quota_cores")
    if quota is not None:
        out.append(Assessment(
            "CPU quota of the run (cores)", f"{quota:g}", DIAGNOSTIC, None,
            "HELD: the run and MariaDB shared this much CPU (bench/cpuquota.py), a slow hour "
            "made on demand; a single thread still ran at the probe's speed"))
    booted = _get(results, "machine", "uptime_s_at_start")
    if booted is not None:
        fresh = booted < FRESH_BOOT_S
        out.append(Assessment(
            "machine up at the start of the run (min)", f"{booted / 60:.1f}", DIAGNOSTIC, None,
            ("FRESH BOOT: in a machine's first quarter hour the official client ran at half "
             "its later speed (docs/performance.md, \"This VM's speed\"); the figures above "
             "measure the boot as well as the code" if fresh else
             "past the first quarter hour after boot, which runs slower")))
    return out
