"""The benchmark's target table judges only what was measured, at the scale it was measured."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.execution import _main_start, _spans
from bench.ingest_throughput import paired_ratio
from bench.machine import (
    FRESH_BOOT_S,
    Sampler,
    interpreter,
    memory_chain,
    memory_msteps,
    python_mops,
    summary,
    uptime_s,
)
from bench.targets import DIAGNOSTIC, assess
from schemas.execution import JobCompleted


def by_figure(results: dict[str, dict[str, object]]) -> dict[str, tuple[str, bool | None]]:
    return {a.figure: (a.measured, a.met) for a in assess(results)}


def test_nothing_measured_is_never_met() -> None:
    got = by_figure({})
    assert got and all(met is None for _, met in got.values())


def test_rates_durations_and_ratios_are_judged() -> None:
    got = by_figure({
        "execution": {"noop_jobs_per_s": 1200.0, "jobs": 100_000, "log_jobs_per_s": 2000.0,
                      "spawn_per_s_16_concurrent": 1400},
        "ingest": {"submit_seconds": 2.0, "jobs": 100_000,
                   "status_ms_at_1000_jobs": {"median": 3.0},
                   "status_ms_at_100000_jobs": {"median": 3.3}},
        "replay": {"replay_events_per_s": 1500, "events": 12_000,
                   "write_statements_per_event": 0.9},
    })
    assert got["no-op jobs/s end to end"] == ("1200.0", True)
    assert got["1,000,000-job submit (hailtop)"] == ("20.0 s", False)  # scaled linearly
    # a ratio measured below the target's scale is not claimed as met
    assert got["batch status latency, 1M vs 1k jobs"] == ("1.10x", False)
    assert got["replay/rebuild events/s"] == ("1500", False)
    assert got["1,000,000-job batch cancelled"] == ("-", None)
    assert got["scheduler memory for 10,000,000 jobs"] == ("-", None)


def test_cancel_and_scheduler_memory() -> None:
    got = by_figure({
        "ingest": {"submit_seconds": 15.0, "jobs": 1_000_000,
                   "cancel_applied_ms_at_1000000_jobs": 40.0,
                   "cancel_scheduling_stopped_within_ms_at_1000000_jobs": 300,
                   "status_ms_at_1000_jobs": {"median": 3.0},
                   "status_ms_at_1000000_jobs": {"median": 3.1},
                   "group_status_ms_at_1000_jobs": {"median": 2.0},
                   "group_status_ms_at_1000000_jobs": {"median": 2.6}},
        "scheduler-memory": {"jobs": 10_000_000, "projected_gib_at_10m_jobs": 2.6}})
    assert got["1,000,000-job batch cancelled"] == ("0.300 s", True)  # the slower of the two
    assert got["1,000,000-job submit (hailtop)"] == ("15.0 s", True)
    assert got["batch status latency, 1M vs 1k jobs"] == ("1.03x", True)
    # the batch's and the job group's are judged apart: a slow group read is not hidden
    assert got["job-group status latency, 1M vs 1k jobs"] == ("1.30x", False)
    assert got["scheduler memory for 10,000,000 jobs"] == ("2.6 GiB", True)


def test_cancel_is_not_met_while_scheduling_goes_on() -> None:
    got = by_figure({"ingest": {"jobs": 1_000_000, "cancel_applied_ms_at_1000000_jobs": 40.0,
                                "cancel_scheduling_stopped_within_ms_at_1000000_jobs": 2500}})
    assert got["1,000,000-job batch cancelled"] == ("2.500 s", False)
    got = by_figure({"ingest": {"jobs": 1_000_000, "cancel_applied_ms_at_1000000_jobs": 40.0}})
    assert got["1,000,000-job batch cancelled"][1] is False  # scheduling not measured


def test_a_rate_below_the_target_batch_size_is_not_met() -> None:
    got = by_figure({"execution": {"noop_jobs_per_s": 5000.0, "jobs": 10_000,
                                   "spawn_per_s_16_concurrent": 1400}})
    assert got["no-op jobs/s end to end"] == ("5000.0", False)


def test_a_process_start_is_stated_beside_the_rate_where_measured() -> None:
    execution = {"noop_jobs_per_s": 1200.0, "jobs": 100_000, "spawn_per_s_16_concurrent": 1400,
                 "start_cpu_us_true": 720.8, "start_cpu_us_no_libc": 33.2, "cpuid_us": 7.71}
    note = {a.figure: a.note for a in assess({"execution": execution})}["no-op jobs/s end to end"]
    assert ("one start of `true` costs 0.721 ms of CPU here, a program without a C library "
            "0.033 (one `cpuid`") in note and "7.71 µs" in note
    del execution["cpuid_us"]  # not x86
    note = {a.figure: a.note for a in assess({"execution": execution})}["no-op jobs/s end to end"]
    assert "a program without a C library 0.033" in note and "cpuid" not in note
    del execution["start_cpu_us_true"]  # no C compiler: nothing said
    note = {a.figure: a.note for a in assess({"execution": execution})}["no-op jobs/s end to end"]
    assert "one start of" not in note


def test_floors_outside_the_project_are_stated_beside_the_figures() -> None:
    notes = {a.figure: a.note for a in assess({
        "ingest": {"submit_seconds": 16.0, "jobs": 100_000, "cores": 2,
                   "cpu_ms_per_job": {"ingest": 0.1, "client (hailtop)": 0.02,
                                      "broker (tansu)": 0.04}},
        "replay": {"replay_events_per_s": 15_000, "events": 60_000,
                   "no_fold_ceiling_events_per_s": 32_000},
    })}
    # 0.06 ms/job of client and broker: 60 s of CPU for 1M jobs, 30 s on 2 cores
    assert "alone: 0.060 ms/job -> at least 30.0 s for 1,000,000 jobs on 2 cores" in (
        notes["1,000,000-job submit (hailtop)"])
    assert "no fold at all: at most 32000 events/s" in notes["replay/rebuild events/s"]
    # without the client's or the broker's CPU, no floor is claimed
    bare = {a.figure: a.note for a in assess({"ingest": {"submit_seconds": 16.0,
                                                          "jobs": 100_000}})}
    assert "alone" not in bare["1,000,000-job submit (hailtop)"]


def test_the_official_clients_own_cpu_is_stated_and_scaled() -> None:
    def note(jobs: int, client_s: float) -> str:
        (submit,) = [a for a in assess({"ingest": {
            "submit_seconds": 90.0, "jobs": jobs, "client_cpu_seconds": client_s}})
            if a.figure.startswith("1,000,000-job submit")]
        return submit.note
    assert "own CPU, one thread: 20.4 s" in note(1_000_000, 20.4)
    assert not note(1_000_000, 20.4).startswith(";")
    assert "scaled" not in note(1_000_000, 20.4).split("own CPU")[1]
    assert "0.8 s for 100,000 jobs (8.0 s scaled to 1M)" in note(100_000, 0.8)


def test_the_clients_ceiling_against_an_instant_server_is_stated_and_scaled() -> None:
    def note(jobs: int, alone_s: float | None) -> str:
        figures = {"submit_seconds": 60.0, "jobs": jobs}
        if alone_s is not None:
            figures["client_alone_seconds"] = alone_s
        (submit,) = [a for a in assess({"ingest": figures})
                     if a.figure.startswith("1,000,000-job submit")]
        return submit.note
    assert "against a server that answers at once: 15.7 s" in note(1_000_000, 15.7)
    assert "scaled" not in note(1_000_000, 15.7)
    assert "answers at once: 1.2 s (12.0 s scaled to 1M)" in note(100_000, 1.2)
    assert "answers at once" not in note(1_000_000, None)


def test_the_servers_part_of_the_submit_is_stated() -> None:
    figures = {"submit_seconds": 18.0, "jobs": 1_000_000,
               "client_before_first_request_s": 6.0, "submit_after_first_request_s": 12.0}
    (submit,) = [a for a in assess({"ingest": figures})
                 if a.figure.startswith("1,000,000-job submit")]
    assert ("first request 6.0 s into the submit (serializing every spec first), the "
            "server's part took 12.0 s") in submit.note
    del figures["client_before_first_request_s"]
    (submit,) = [a for a in assess({"ingest": figures})
                 if a.figure.startswith("1,000,000-job submit")]
    assert "first request" not in submit.note


def test_the_machine_speed_is_a_diagnostic_row_beside_the_targets() -> None:
    speed = summary([3.4, 6.5, 6.4, 5.0, 3.6])
    assert speed == {"python_mops_median": 5.0, "python_mops_p10": 3.4,
                     "python_mops_p90": 6.5, "samples": 5}
    got = {a.figure: a for a in assess({"machine": speed})}
    row = got["machine speed (pure-Python probe, M iterations/s)"]
    assert (row.measured, row.target, row.met) == ("5.0", DIAGNOSTIC, None)
    assert "3.4-6.5" in row.note and "5 samples" in row.note
    assert "machine speed (pure-Python probe, M iterations/s)" not in by_figure({})
    assert "memory latency (16 MiB read chain, M steps/s)" not in got
    assert summary([]) == {}


def test_the_machine_speed_row_names_the_python_that_ran_the_probe() -> None:
    speed = {**summary([5.0, 6.0, 7.0]), "python": interpreter()}
    assert speed["python"].startswith(f"{platform.python_version()} /")
    (row,) = [a for a in assess({"machine": speed}) if a.figure.startswith("machine speed")]
    assert row.note.endswith(f"; Python {speed['python']}")


def test_the_memory_probe_is_a_diagnostic_row_of_its_own() -> None:
    speed = summary([5.0, 6.0, 7.0], [2.0, 4.5, 4.0])
    assert speed == {"python_mops_median": 6.0, "python_mops_p10": 5.0, "python_mops_p90": 7.0,
                     "memory_msteps_median": 4.0, "memory_msteps_p10": 2.0,
                     "memory_msteps_p90": 4.5, "samples": 3}
    got = {a.figure: a for a in assess({"machine": speed})}
    row = got["memory latency (16 MiB read chain, M steps/s)"]
    assert (row.measured, row.target, row.met) == ("4.0", DIAGNOSTIC, None)
    assert "2.0-4.5" in row.note


def test_a_run_started_in_the_first_quarter_hour_after_boot_is_flagged() -> None:
    row_of = {a.figure: a for a in assess({"machine": {"uptime_s_at_start": 240}})}
    fresh = row_of["machine up at the start of the run (min)"]
    assert (fresh.measured, fresh.target, fresh.met) == ("4.0", DIAGNOSTIC, None)
    assert fresh.note.startswith("FRESH BOOT")
    row_of = {a.figure: a for a in assess({"machine": {"uptime_s_at_start": FRESH_BOOT_S}})}
    settled = row_of["machine up at the start of the run (min)"]
    assert settled.measured == "15.0" and "FRESH BOOT" not in settled.note
    assert "machine up at the start of the run (min)" not in by_figure({"machine": {}})


def test_a_run_held_to_a_cpu_quota_says_so_beside_the_targets() -> None:
    row_of = {a.figure: a for a in assess({"machine": {"cpu_quota_cores": 0.6}})}
    held = row_of["CPU quota of the run (cores)"]
    assert (held.measured, held.target, held.met) == ("0.6", DIAGNOSTIC, None)
    assert held.note.startswith("HELD")
    assert "CPU quota of the run (cores)" not in by_figure({"machine": {"samples": 3}})


def test_uptime_is_read_from_the_kernel(tmp_path: Path) -> None:
    up = uptime_s()
    assert up is not None and up > 0
    (tmp_path / "uptime").write_text("1234.56 789.01\n")
    assert uptime_s(str(tmp_path / "uptime")) == 1234.56
    (tmp_path / "garbled").write_text("")
    assert uptime_s(str(tmp_path / "garbled")) is None
    assert uptime_s(str(tmp_path / "missing")) is None


def test_the_sampler_samples_until_stopped() -> None:
    sampler = Sampler(every_s=0.01, iterations=1_000, chain_slots=1 << 10)
    sampler.start()
    while len(sampler._samples) < 3:
        time.sleep(0.01)
    got = sampler.stop()
    assert got["samples"] >= 3 and 0 < got["python_mops_p10"] <= got["python_mops_p90"]
    assert 0 < got["memory_msteps_p10"] <= got["memory_msteps_p90"]
    n = got["samples"]
    time.sleep(0.05)
    assert len(sampler._samples) == n  # no sample after stop()
    # The samples since a time: all of them since before the start, none since after the stop.
    assert sampler.since(0.0)["samples"] == n
    assert sampler.since(time.monotonic()) == {}
    mid = sampler._times[n // 2]
    assert sampler.since(mid)["samples"] == n - n // 2
    # A window within the run: from one sample's time to another's, both ends included.
    assert sampler.since(sampler._times[1], sampler._times[2])["samples"] == 2
    assert sampler.since(mid, mid - 1.0) == {}


def test_the_cpu_note_names_the_machine_speed_during_the_scenario() -> None:
    figures = {"noop_jobs_per_s": 900.0, "jobs": 100_000, "cpu_ms_per_job_total": 2.2,
               "cpu_ms_per_job": {"worker": 0.5}, "ceiling_per_s": 909,
               "python_mops_median_during": 5.1}
    (e2e,) = [a for a in assess({"execution": figures})
              if a.figure.startswith("no-op jobs/s end to end")]
    assert "(machine speed during it: probe median 5.1)" in e2e.note
    figures["memory_msteps_median_during"] = 3.9
    (e2e,) = [a for a in assess({"execution": figures})
              if a.figure.startswith("no-op jobs/s end to end")]
    assert "(machine speed during it: probe median 5.1, memory probe median 3.9)" in e2e.note
    del figures["memory_msteps_median_during"]
    del figures["python_mops_median_during"]
    (e2e,) = [a for a in assess({"execution": figures})
              if a.figure.startswith("no-op jobs/s end to end")]
    assert "machine speed during it" not in e2e.note


def test_the_machine_probe_is_a_rate_of_the_loop() -> None:
    assert 0 < python_mops(iterations=20_000, rounds=2) < float("inf")


def test_the_memory_chain_is_one_cycle_through_every_slot() -> None:
    chain = memory_chain(1 << 12)
    seen, i = set(), 0
    for _ in range(len(chain)):
        seen.add(i)
        i = chain[i]
    assert i == 0 and len(seen) == len(chain)  # back at the start after visiting them all
    # No constant stride between consecutive reads for a prefetcher to follow.
    assert len({(chain[k] - k) % len(chain) for k in range(len(chain))}) >= len(chain) // 4
    with pytest.raises(ValueError, match="power of two"):
        memory_chain(1000)
    assert 0 < memory_msteps(chain, steps=10_000) < float("inf")


def test_the_submit_note_names_the_machine_speed_during_the_submit_itself() -> None:
    figures = {"submit_seconds": 18.0, "jobs": 1_000_000, "python_mops_median_during": 7.0,
               "python_mops_median_during_submit": 5.2,
               "memory_msteps_median_during_submit": 4.1}

    def note() -> str:
        (submit,) = [a for a in assess({"ingest": figures})
                     if a.figure.startswith("1,000,000-job submit")]
        return submit.note

    assert ("machine speed during the submit itself: probe median 5.2, memory probe median "
            "4.1") in note()
    del figures["memory_msteps_median_during_submit"]
    assert note().endswith("during the submit itself: probe median 5.2")
    del figures["python_mops_median_during_submit"]
    assert "during the submit itself" not in note()


def test_the_paired_ratio_judges_status_where_a_run_has_it() -> None:
    reads = {"status_ms_at_1000_jobs": {"median": 5.0},
             "status_ms_at_1000000_jobs": {"median": 6.5},  # 1.30x of the medians
             "group_status_ms_at_1000_jobs": {"median": 5.0},
             "group_status_ms_at_1000000_jobs": {"median": 5.0}}
    got = by_figure({"ingest": {"jobs": 1_000_000, **reads,
                                "status_paired_ratio_at_1000000_jobs": 1.05,
                                "group_status_paired_ratio_at_1000000_jobs": 1.25}})
    assert got["batch status latency, 1M vs 1k jobs"] == ("1.05x", True)
    # the paired figure can fail too: it is what is judged, not the better of the two
    assert got["job-group status latency, 1M vs 1k jobs"] == ("1.25x", False)


def test_a_round_s_ratio_leaves_the_load_both_reads_shared_out() -> None:
    # the load moves both reads of a round alike: 2, 10, 3 ms; the big read is 10% slower
    small = [2.0, 10.0, 3.0, 2.0, 10.0]
    big = [2.2, 11.0, 3.3, 2.2, 11.0]
    assert paired_ratio(big, small) == 1.1
    assert paired_ratio(small, small) == 1.0
    # rounds' ratios 0.5, 2, 3: their median
    assert paired_ratio([1.0, 4.0, 9.0], [2.0, 2.0, 3.0]) == 2.0


@given(st.lists(st.tuples(st.floats(0.1, 1e3), st.floats(0.1, 1e3), st.floats(0.5, 2.0)),
                min_size=1, max_size=50))
def test_a_common_factor_of_every_round_gives_that_factor(
        rounds: list[tuple[float, float, float]]) -> None:
    small = [a for a, _, _ in rounds]
    k = rounds[0][2]
    assert paired_ratio([a * k for a in small], small) == pytest.approx(k, abs=1e-3)


def test_paired_latencies_must_pair() -> None:
    with pytest.raises(ValueError, match="same number"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="same number"):
        paired_ratio([], [])


def test_an_attempts_time_is_split_by_the_times_on_the_log() -> None:
    # (SJ on the log, attempt start, process start, attempt end, MJC on the log), milliseconds
    ended = [(1_000, 1_010, 1_011, 1_012, 1_040), (1_000, 1_030, 1_030, 1_031, 1_060)]
    spans = _spans(ended, rate=1_000.0)
    assert spans == {"sj_to_start": 20.0, "start_to_process": 0.5, "process_to_end": 1.0,
                     "end_to_mjc": 28.5, "in_flight": 50.0}
    status = msgspec.json.encode({"state": "succeeded", "container_statuses": {"main": {
        "name": "main", "timing": {"running": {"start_time": 1_011, "finish_time": 1_012}}}}})
    def mjc(**kw: Any) -> JobCompleted:
        return JobCompleted(batch_id=1, job_id=1, attempt_id="a", instance_name="w",
                            state="Success", exit_code=0, end_time_ms=1_013, **kw)

    assert _main_start(mjc(status=status.decode())) == 1_011
    assert _main_start(mjc(main_start_ms=1_011, main_end_ms=1_012)) == 1_011  # compact
    assert _main_start(mjc()) is None
    assert _main_start(mjc(status='{"container_statuses": {"main": {"timing": {}}}}')) is None
    assert _spans([], rate=1_000.0) == {}
    note = next(a.note for a in assess({"execution": {"log_jobs_per_s": 1000.0,
                                                      "attempt_ms": spans}})
                if a.figure.startswith("no-op jobs/s on the log"))
    assert "to its start in the worker 20.0" in note and "50.0 attempts in flight" in note


def test_end_to_end_is_judged_to_the_api_reporting_the_batch_complete() -> None:
    """A projector behind the jobs shows the batch complete later than its last MJC: the rate
    judged is the lower of the two, and both are in the note."""
    execution = {"noop_jobs_per_s": 1300.0, "noop_jobs_per_s_visible": 990.0, "jobs": 100_000,
                 "spawn_per_s_16_concurrent": 2000}
    [judged] = [a for a in assess({"execution": execution})
                if a.figure == "no-op jobs/s end to end"]
    assert (judged.measured, judged.met) == ("990.0", False)
    assert "1300.0/s to its completion time" in judged.note
    execution["noop_jobs_per_s_visible"] = 1250.0
    [judged] = [a for a in assess({"execution": execution})
                if a.figure == "no-op jobs/s end to end"]
    assert (judged.measured, judged.met) == ("1250.0", True)
