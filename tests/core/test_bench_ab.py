"""The A/B comparison pairs runs in a balanced order and judges differences by their interval."""

from __future__ import annotations

import signal
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import ab
from bench.ab import (
    JOBS,
    PORT_TAKEN,
    compare,
    figures,
    order,
    paired,
    replay_figures,
    run_step,
    submit_figures,
    t975,
)


def test_order_alternates_which_arm_runs_first() -> None:
    assert order(1) == ["a", "b"]
    assert order(4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    with pytest.raises(ValueError, match="at least one pair"):
        order(0)


@given(st.integers(min_value=1, max_value=50))
def test_order_runs_each_arm_once_per_pair(pairs: int) -> None:
    runs = order(pairs)
    assert len(runs) == 2 * pairs
    assert all(sorted(runs[i:i + 2]) == ["a", "b"] for i in range(0, len(runs), 2))
    # Over an even number of pairs each arm runs first as often as the other.
    firsts = runs[::2]
    assert abs(firsts.count("a") - firsts.count("b")) <= 1


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(3) == pytest.approx(3.182)
    assert t975(1000) == pytest.approx(1.96)
    with pytest.raises(ValueError, match="two pairs"):
        t975(0)


def test_a_consistent_drop_is_shown_and_noise_is_not() -> None:
    # The machine's speed moves both arms together; B is 0.05 lower in every pair.
    a = [0.40, 0.46, 0.43, 0.50]
    b = [x - 0.05 for x in a]
    dropped = paired("worker", a, b)
    assert dropped.diff == pytest.approx(-0.05)
    assert dropped.ci_high is not None and dropped.ci_high < 0
    assert dropped.verdict == "B lower"
    assert dropped.relative == pytest.approx(-0.05 / statistics.fmean(a))
    # Differences of both signs: no difference shown.
    noisy = paired("worker", [0.40, 0.46, 0.43, 0.50], [0.45, 0.41, 0.47, 0.44])
    assert noisy.verdict == "no difference shown"
    assert noisy.ci_low is not None and noisy.ci_low < 0 < (noisy.ci_high or 0)
    assert (dropped.median_diff, dropped.b_higher, dropped.pairs) == (
        pytest.approx(-0.05), 0, 4)
    assert paired("rate", [900.0], [1000.0]).verdict == "one pair: no interval"
    assert paired("rate", [900.0, 950.0], [1000.0, 1060.0]).verdict == "B higher"


def test_one_odd_pair_moves_the_median_less_than_the_mean() -> None:
    a = [0.38, 0.38, 0.35, 0.44]
    b = [0.35, 0.49, 0.33, 0.42]  # lower by 0.02-0.03 but in the second pair, +0.11 there
    got = paired("projector", a, b)
    assert got.verdict == "no difference shown"
    assert got.median_diff == pytest.approx(-0.02)
    assert got.b_higher == 1 and got.pairs == 4
    assert got.diff == pytest.approx(0.01)


def test_paired_refuses_unmatched_runs() -> None:
    with pytest.raises(ValueError, match="2 A runs against 1 B runs"):
        paired("rate", [1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired("rate", [], [])


@given(st.lists(st.floats(min_value=0.1, max_value=10), min_size=2, max_size=20),
       st.floats(min_value=-1, max_value=1))
def test_a_constant_shift_is_its_own_difference(a: list[float], shift: float) -> None:
    got = paired("x", a, [x + shift for x in a])
    assert got.diff == pytest.approx(shift, abs=1e-9)
    assert got.ci_low is not None and got.ci_high is not None
    assert got.ci_low <= got.diff <= got.ci_high
    assert got.ci_high - got.ci_low == pytest.approx(0, abs=1e-6)


def run(rate: float, worker: float, jobs: float = 0.6) -> dict[str, object]:
    return {"noop_jobs_per_s": rate, "cpu_ms_per_job_total": jobs + worker + 0.5,
            "cpu_ms_per_job": {JOBS: jobs, "worker": worker, "projector": 0.5},
            "python_mops_median_during": 7.0, "machine_busy_share": 0.9}


def test_figures_of_a_run() -> None:
    got = figures(run(1000.0, 0.4))
    assert got["jobs/s end to end"] == 1000.0
    assert got["CPU ms/job, total"] == pytest.approx(1.5)
    assert got["CPU ms/job, the stack's own (all but the jobs)"] == pytest.approx(0.9)
    assert got["the stack's own CPU per job / the jobs' CPU per job"] == pytest.approx(1.5)
    assert got["CPU ms/job, worker"] == 0.4
    assert got["machine probe, M iterations/s"] == 7.0
    assert got["machine busy share"] == 0.9


def test_compare_covers_the_figures_every_run_has() -> None:
    runs_a = [figures(run(1000.0, 0.40)), figures(run(900.0, 0.45))]
    runs_b = [figures(run(1040.0, 0.35)), figures(run(950.0, 0.40))]
    del runs_b[1]["machine probe, M iterations/s"]  # a run without the probe
    got = {p.figure: p for p in compare(runs_a, runs_b)}
    assert "machine probe, M iterations/s" not in got
    assert got["CPU ms/job, worker"].diff == pytest.approx(-0.05)
    assert got["CPU ms/job, worker"].verdict == "B lower"
    assert got["jobs/s end to end"].diff == pytest.approx(45.0)


def test_submit_figures_of_a_run() -> None:
    got = submit_figures({
        "submit_seconds": 24.5, "submit_after_first_request_s": 19.0,
        "client_before_first_request_s": 5.5, "commit_visible_after_submit_s": 7.25,
        "cpu_ms_per_job_total": 0.05, "cpu_ms_per_job": {"ingest": 0.02, "projector": 0.03},
        "python_mops_median_during_submit": 4.5, "python_mops_median_during": 5.0})
    assert got == {
        "submit s": 24.5, "submit s, the server's part": 19.0,
        "submit s, the client's before it": 5.5, "commit visible s after the submit": 7.25,
        "CPU ms/job, total": 0.05, "CPU ms/job, ingest": 0.02, "CPU ms/job, projector": 0.03,
        "machine probe in the submit, M iterations/s": 4.5}


def test_submit_figures_in_cpu_seconds_when_the_run_has_them() -> None:
    got = submit_figures({
        "submit_seconds": 12.0, "cpu_ms_per_job_total": 0.03, "cpu_ms_per_job": {"ingest": 0.007},
        "cpu_seconds_total": 31.25, "cpu_seconds": {"ingest": 7.12, "projector": 5.5}})
    assert got == {"submit s": 12.0, "CPU s, total": 31.25, "CPU s, ingest": 7.12,
                   "CPU s, projector": 5.5}


def test_submit_figures_without_the_batchs_creation_time() -> None:
    # A batch whose creation time the API did not give: no split of the submit.
    got = submit_figures({"submit_seconds": 30.0, "cpu_ms_per_job_total": 0.1,
                          "cpu_ms_per_job": {}})
    assert got == {"submit s": 30.0, "CPU ms/job, total": 0.1}


def test_replay_figures_of_a_run() -> None:
    got = replay_figures({
        "replay_events_per_s": 98_000, "replay_cpu_seconds_total": 5.5,
        "replay_cpu_seconds": {"replay (projector sink)": 3.75, "mariadb (shared)": 1.75},
        "replay_machine_busy_share": 0.94, "python_mops_median_during": 9.5,
        "replay_1_lanes_events_per_s": 60_000})
    assert got == {"replay events/s": 98_000, "CPU s, total": 5.5,
                   "CPU s, replay (projector sink)": 3.75, "CPU s, mariadb (shared)": 1.75,
                   "machine busy share": 0.94, "machine probe, M iterations/s": 9.5}


class FakeRun:
    """A run's process that ends by itself (``ends_with``) or on SIGINT (its stack down)."""

    def __init__(self, ends_with: int | None) -> None:
        self.code = ends_with
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.code = -sig

    def wait(self, timeout: float | None = None) -> int:
        assert self.code is not None, "waited for a run nothing ends"
        return self.code

    def kill(self) -> None:
        self.code = -9


def _step(failures: dict[tuple[str, int], str]) -> tuple[
        Callable[[str, int], tuple[FakeRun, Path]],
        Callable[[str, Any, Path], dict[str, Any]], list[tuple[str, int, FakeRun]]]:
    """start/result functions of a step whose arm ``name`` fails on attempt ``n`` with
    ``failures[(name, n)]``; the other arms' runs still going when one fails."""
    started: list[tuple[str, int, FakeRun]] = []

    def start(name: str, attempt: int) -> tuple[FakeRun, Path]:
        run = FakeRun(1 if (name, attempt) in failures else None)
        started.append((name, attempt, run))
        return run, Path(f"run-{name}-{attempt}.log")

    def result(name: str, proc: Any, log: Path) -> dict[str, Any]:
        attempt = int(log.stem.rsplit("-", 1)[1])
        if (name, attempt) in failures:
            raise RuntimeError(f"arm {name} failed with code 1:\n{failures[(name, attempt)]}")
        proc.code = 0
        return {"arm": name, "attempt": attempt}

    return start, result, started


def test_a_step_with_a_taken_port_runs_again_and_its_other_arm_is_stopped_first() -> None:
    start, result, started = _step({("a", 0): f"up failed: ingest: port(s) [29605] {PORT_TAKEN}"})
    got = run_step(["a", "b"], start, result)
    assert got == {"a": {"arm": "a", "attempt": 1}, "b": {"arm": "b", "attempt": 1}}
    (b0,) = [run for name, n, run in started if (name, n) == ("b", 0)]
    assert b0.signals == [signal.SIGINT]  # its bench's finally takes its stack down
    assert [(name, n) for name, n, _ in started] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_a_step_failing_otherwise_stops_the_other_arm_and_raises() -> None:
    start, result, started = _step({("a", 0): "Traceback: something else"})
    with pytest.raises(RuntimeError, match="something else"):
        run_step(["a", "b"], start, result)
    assert [(name, n, run.signals) for name, n, run in started] == [
        ("a", 0, []), ("b", 0, [signal.SIGINT])]


def test_a_port_taken_again_and_again_is_reported_after_the_retries() -> None:
    taken = f"port(s) [1] {PORT_TAKEN}"
    start, result, started = _step({("b", 0): taken, ("b", 1): taken})
    with pytest.raises(RuntimeError, match=PORT_TAKEN):
        run_step(["a", "b"], start, result, retries=1)
    assert len(started) == 4
    # A finished arm is not signalled: only runs still going are.
    assert all(run.signals == [] for _, _, run in started)


def test_an_arm_runs_on_the_venvs_it_is_given(tmp_path: Path) -> None:
    # --b-venv: the arm's .venv links to the given venv (its Python runs the bench and the
    # stack), its .venv-hail stays this checkout's.
    other = tmp_path / "other-venv"
    (other / "bin").mkdir(parents=True)
    where, worktree = ab._checkout(".", tmp_path, {".venv": other})
    assert not worktree
    assert (where / ".venv").resolve() == other.resolve()
    assert (where / ".venv-hail").readlink() == ab.REPO / ".venv-hail"
    assert (where / "bench" / "ab.py").read_text() == (ab.REPO / "bench" / "ab.py").read_text()


def test_an_arm_venv_that_is_not_one_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ab.main(["--b-venv", str(tmp_path)])
    assert "is not a venv" in capsys.readouterr().err


def test_two_arms_differing_only_by_venv_are_not_the_same(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one pair"):  # past the sameness check
        ab.main(["--b-venv", str(ab.REPO / ".venv"), "--pairs", "0"])


def test_a_step_stopped_from_outside_stops_its_runs_and_goes_on_stopping() -> None:
    # Ctrl-C, or SIGTERM made SystemExit (bench.stop_on_signals), while waiting for a step.
    started: list[FakeRun] = []

    def start(name: str, attempt: int) -> tuple[FakeRun, Path]:
        started.append(FakeRun(None))
        return started[-1], Path(f"run-{name}.log")

    def result(name: str, proc: Any, log: Path) -> dict[str, Any]:
        raise SystemExit(143)

    with pytest.raises(SystemExit):
        run_step(["a", "b"], start, result, retries=3)
    assert [run.signals for run in started] == [[signal.SIGINT], [signal.SIGINT]]
