"""Compare two versions of the stack on the execution scenario (or the 1M submit, or the
rebuild), in interleaved runs: ``python -m bench.ab --b REF [--a REF] [--a-env K=V ...]
[--b-env K=V ...] [--pairs N] [--scenario ingest|replay]``.

Why: this VM's speed moves by 10-25% within an hour (``bench/machine.py``), so one bench of
each version cannot show a change worth a few percent: every earlier "did not help" was judged
that way. Here the two arms run alternately, in A B B A order (a drift in the machine's speed
through the session falls on both arms alike), and each figure is compared pair by pair (an A
run with the B run beside it), with a 95% confidence interval of the mean difference. Adjacent
runs still see different minutes of the machine (three pairs at one hour: CPU per job moved by
up to 15% from one run to the next), so ``--together`` runs each pair's two arms at the same
time, two stacks side by side: both arms see the same minute, and their CPU per job compares
with far less noise (each arm's rate is then about half of what it would be alone).

An arm is a git ref (checked out in a temporary worktree; ``.`` is a copy of this checkout as it
stands at the start, uncommitted changes and all, so editing it meanwhile changes no run) plus
environment variables for its stack, so a setting is compared by giving only ``--b-env``. Each
run is ``python -m bench execution`` of the arm's own code, in a process of its own, on the
venvs of this checkout (or, with ``--a-venv``/``--b-venv`` and ``--a-hail-venv``/
``--b-hail-venv``, on others: to compare two Python builds); with ``--scenario ingest``,
``python -m bench ingest --submit-only``: the submit's time, its server part and each
component's CPU per job (the arm's ref must have ``--submit-only``); with ``--scenario
replay``, ``python -m bench replay --replay-modes default``: the rebuild's events/s with its
default lanes and the CPU of the lanes and MariaDB (the arm's ref must have
``--replay-modes``).

Beside the rate and each component's CPU per job, the comparison shows the stack's own CPU per
job (all but the jobs' processes) relative to the jobs' processes' CPU: every job execs
``true``, whose cost tracks the machine's speed in the same minute, so the ratio changes with
the stack's code far more than with the hour.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from bench import stop_on_signals
from bench.cpuquota import QuotaError, cpu_quota

REPO = Path(__file__).resolve().parents[1]
JOBS = "jobs (worker children)"
"""The component of the jobs' own processes in ``cpu_ms_per_job``."""

# Two-sided 95% quantiles of Student's t by degrees of freedom (1-30); the normal's beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with ``dof`` degrees of freedom."""
    if dof < 1:
        raise ValueError("a confidence interval needs at least two pairs")
    return _T975[dof - 1] if dof <= len(_T975) else 1.960


def order(pairs: int) -> list[str]:
    """The arms' run order for ``pairs`` pairs: A B, B A, A B, ... (each pair is two
    neighbouring runs, so a steady drift favours neither arm over the whole)."""
    if pairs < 1:
        raise ValueError("at least one pair")
    return [arm for i in range(pairs) for arm in (("a", "b") if i % 2 == 0 else ("b", "a"))]


@dataclass(frozen=True)
class Paired:
    """One figure over the pairs: each arm's mean, and B minus A with its 95% interval
    (None for a single pair)."""

    figure: str
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float | None
    ci_high: float | None
    median_diff: float
    """The median of the pairs' differences: one odd pair moves it less than the mean."""
    b_higher: int
    """In how many pairs B's figure was higher than A's."""
    pairs: int

    @property
    def relative(self) -> float:
        """B against A, as a fraction of A's mean (0 when A's mean is 0)."""
        return self.diff / self.mean_a if self.mean_a else 0.0

    @property
    def verdict(self) -> str:
        """Whether the interval excludes no difference, and which way."""
        if self.ci_low is None or self.ci_high is None:
            return "one pair: no interval"
        if self.ci_low > 0:
            return "B higher"
        if self.ci_high < 0:
            return "B lower"
        return "no difference shown"


def paired(figure: str, a: Sequence[float], b: Sequence[float]) -> Paired:
    """The pairwise comparison of ``a`` and ``b`` (same length, pair i is ``a[i], b[i]``)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"{figure}: {len(a)} A runs against {len(b)} B runs")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(diffs)
    low = high = None
    if len(diffs) > 1:
        half = t975(len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        low, high = mean - half, mean + half
    return Paired(figure, statistics.fmean(a), statistics.fmean(b), mean, low, high,
                  statistics.median(diffs), sum(d > 0 for d in diffs), len(diffs))


def figures(execution: Mapping[str, Any]) -> dict[str, float]:
    """The figures compared, from one run's ``execution`` results."""
    per_job: Mapping[str, float] = execution["cpu_ms_per_job"]
    total = float(execution["cpu_ms_per_job_total"])
    jobs = float(per_job.get(JOBS, 0.0))
    out = {"jobs/s end to end": float(execution["noop_jobs_per_s"])}
    if "noop_jobs_per_s_visible" in execution:  # to the API reporting the batch complete
        out["jobs/s end to end, to the batch shown complete"] = float(
            execution["noop_jobs_per_s_visible"])
    out |= {"CPU ms/job, total": total,
           "CPU ms/job, the stack's own (all but the jobs)": total - jobs}
    if jobs > 0:
        out["the stack's own CPU per job / the jobs' CPU per job"] = (total - jobs) / jobs
    out |= {f"CPU ms/job, {name}": float(ms) for name, ms in per_job.items()}
    if "machine_busy_share" in execution:
        out["machine busy share"] = float(execution["machine_busy_share"])
    if "python_mops_median_during" in execution:
        out["machine probe, M iterations/s"] = float(execution["python_mops_median_during"])
    return out


def submit_figures(ingest: Mapping[str, Any]) -> dict[str, float]:
    """The figures compared, from one ``ingest --submit-only`` run's results."""
    out = {"submit s": float(ingest["submit_seconds"])}
    for key, name in (("submit_after_first_request_s", "submit s, the server's part"),
                      ("client_before_first_request_s", "submit s, the client's before it"),
                      ("commit_visible_after_submit_s", "commit visible s after the submit")):
        if key in ingest:
            out[name] = float(ingest[key])
    if "cpu_seconds" in ingest:  # CPU per job of a submit is a few microseconds: seconds
        out["CPU s, total"] = float(ingest["cpu_seconds_total"])
        out |= {f"CPU s, {name}": float(s) for name, s in ingest["cpu_seconds"].items()}
    else:
        out["CPU ms/job, total"] = float(ingest["cpu_ms_per_job_total"])
        out |= {f"CPU ms/job, {name}": float(ms)
                for name, ms in ingest["cpu_ms_per_job"].items()}
    if "machine_busy_share" in ingest:
        out["machine busy share"] = float(ingest["machine_busy_share"])
    if "python_mops_median_during_submit" in ingest:
        out["machine probe in the submit, M iterations/s"] = float(
            ingest["python_mops_median_during_submit"])
    return out


def replay_figures(replay: Mapping[str, Any]) -> dict[str, float]:
    """The figures compared, from one ``replay --replay-modes default`` run's results: the
    rebuild's default lanes."""
    out = {"replay events/s": float(replay["replay_events_per_s"]),
           "CPU s, total": float(replay["replay_cpu_seconds_total"])}
    out |= {f"CPU s, {name}": float(s) for name, s in replay["replay_cpu_seconds"].items()}
    out["machine busy share"] = float(replay["replay_machine_busy_share"])
    if "python_mops_median_during" in replay:
        out["machine probe, M iterations/s"] = float(replay["python_mops_median_during"])
    return out


def compare(runs_a: Sequence[Mapping[str, float]], runs_b: Sequence[Mapping[str, float]]
            ) -> list[Paired]:
    """Every figure present in all runs of both arms, compared pair by pair."""
    names = [n for n in runs_a[0] if all(n in r for r in (*runs_a, *runs_b))]
    return [paired(n, [r[n] for r in runs_a], [r[n] for r in runs_b]) for n in names]


@dataclass(frozen=True)
class Arm:
    name: str
    ref: str
    env: dict[str, str]
    directory: Path
    """The arm's code, with its venvs linked in as ``.venv`` and ``.venv-hail``."""


def _env_pairs(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"an environment setting is KEY=VALUE, not {item!r}")
        out[key] = value
    return out


_NOT_COPIED = shutil.ignore_patterns(".git", ".venv", ".venv-hail", "results", "__pycache__",
                                     ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
                                     "node_modules", ".data")


VENVS = (".venv", ".venv-hail")


def _checkout(ref: str, root: Path, venvs: Mapping[str, Path] | None = None
              ) -> tuple[Path, bool]:
    """A directory holding ``ref``'s code with venvs linked in (by default this checkout's;
    ``venvs`` maps ``.venv`` or ``.venv-hail`` to others): a copy of this checkout's files for
    ``.``, else a detached worktree of ``ref``; and whether it is a worktree (to remove with
    git)."""
    where = Path(tempfile.mkdtemp(prefix="code-", dir=root))
    if ref == ".":
        where.rmdir()
        shutil.copytree(REPO, where, ignore=_NOT_COPIED, symlinks=True)
    else:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                        str(where), ref], check=True)
    for venv in VENVS:
        (where / venv).symlink_to((venvs or {}).get(venv, REPO / venv))
    return where, ref != "."


def _start(arm: Arm, scenario: list[str], stack: str, tmp: Path, log: Path
           ) -> subprocess.Popen[bytes]:
    env = {**os.environ, **arm.env, "TMPDIR": str(tmp), "HS_BENCH_KEEP_FILES": "1"}
    with log.open("w") as out:
        return subprocess.Popen(
            [str(arm.directory / ".venv" / "bin" / "python"), "-m", "bench", *scenario,
             "--stack", stack], cwd=arm.directory,
            env=env, stdout=out, stderr=subprocess.STDOUT)


PORT_TAKEN = "already in use"
"""What a stack's ``up`` says when a port of its block is taken (services/stack)."""


class Process(Protocol):
    """What :func:`run_step` needs of a run's process (a ``subprocess.Popen``)."""

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


def run_step(names: Sequence[str], start: Callable[[str, int], tuple[Process, Path]],
             result: Callable[[str, Process, Path], dict[str, Any]], *, retries: int = 1
             ) -> dict[str, dict[str, Any]]:
    """Run one step's arms (both at once with ``--together``): their results by arm name.

    ``start(name, attempt)`` launches an arm's run, ``result(name, process, log)`` waits for it
    and raises RuntimeError when it failed. Then the step's other runs still going get SIGINT
    and are waited for, so that each bench's ``finally`` takes its stack down: a stack left
    running taxes every later run. A step that failed on a taken port runs again, up to
    ``retries`` times: the two stacks of a step each pick a free block of ports, and one may
    bind a port of the other's block before that one starts.
    """
    for attempt in range(retries + 1):
        runs = [(name, *start(name, attempt)) for name in names]
        try:
            return {name: result(name, proc, log) for name, proc, log in runs}
        except RuntimeError as e:
            stop([proc for _, proc, _ in runs])
            if attempt < retries and PORT_TAKEN in str(e):
                print(f"a port was taken ({e.args[0].splitlines()[0]}): the step again",
                      flush=True)
                continue
            raise
        except BaseException:  # Ctrl-C, or SIGTERM (stop_on_signals): the runs go down too
            stop([proc for _, proc, _ in runs])
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def stop(processes: Sequence[Process], timeout_s: float = 120.0) -> None:
    """SIGINT the runs still going and wait for them (their stacks go down); kill the ones
    that do not end within ``timeout_s``."""
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in processes:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _result(arm: Arm, scenario: str, proc: Process, log: Path) -> dict[str, Any]:
    code = proc.wait()
    text = log.read_text()
    wrote = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("wrote ")]
    if code != 0 or not wrote:
        raise RuntimeError(f"arm {arm.name} ({arm.ref}) failed with code {code}; "
                           f"its output is in {log}:\n{text[-2000:]}")
    result = json.loads((arm.directory / wrote[-1]).read_text())
    return dict(result[scenario])


def _execution_rate(got: Mapping[str, Any]) -> str:
    return f"{got['noop_jobs_per_s']} jobs/s, {got['cpu_ms_per_job_total']} ms CPU/job"


def _submit_rate(got: Mapping[str, Any]) -> str:
    return f"{got['submit_seconds']} s submit, {got['cpu_ms_per_job_total']} ms CPU/job"


def _replay_rate(got: Mapping[str, Any]) -> str:
    return (f"{got['replay_events_per_s']} events/s, "
            f"{got['replay_cpu_ms_per_event_total']} ms CPU/event")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", default=".", help="git ref of arm A (default: this checkout)")
    parser.add_argument("--b", default=".", help="git ref of arm B (default: this checkout)")
    parser.add_argument("--a-env", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--b-env", nargs="*", default=[], metavar="KEY=VALUE")
    for side in ("a", "b"):
        parser.add_argument(f"--{side}-venv", type=Path, metavar="DIR",
                            help=f"arm {side.upper()}'s venv (default: this checkout's .venv); "
                                 "its Python runs the bench and the stack")
        parser.add_argument(f"--{side}-hail-venv", type=Path, metavar="DIR",
                            help=f"arm {side.upper()}'s official client venv (default: "
                                 "this checkout's .venv-hail)")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--exec-jobs", type=int, default=50_000)
    parser.add_argument("--scenario", choices=("execution", "ingest", "replay"),
                        default="execution",
                        help="ingest: the submit of --jobs jobs alone (bench ingest "
                             "--submit-only); replay: the rebuild's default lanes over a log "
                             "of --replay-jobs jobs (bench replay --replay-modes default)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="ingest: the batch's jobs")
    parser.add_argument("--replay-jobs", type=int, default=100_000,
                        help="replay: the log's jobs (about 3 events each)")
    parser.add_argument("--stack", choices=("durable", "memory"), default="memory")
    parser.add_argument("--together", action="store_true",
                        help="run each pair's two arms at the same time, side by side: both "
                             "see the same minute of the machine (CPU per job compares well; "
                             "each arm's rate is then about half its own)")
    parser.add_argument("--cpu-quota", type=float, metavar="CORES",
                        help="hold every run, and the machine's MariaDB, to this many cores "
                             "of CPU (a cgroup's quota: a slow machine on demand; see "
                             "bench.cpuquota)")
    args = parser.parse_args(argv)
    venvs = {name: {venv: path.resolve() for venv, path in (
        (".venv", getattr(args, f"{name}_venv")),
        (".venv-hail", getattr(args, f"{name}_hail_venv"))) if path is not None}
        for name in ("a", "b")}
    for path in (p for arm_venvs in venvs.values() for p in arm_venvs.values()):
        if not (path / "bin" / "python").exists():
            parser.error(f"{path} is not a venv (no bin/python)")
    if args.a == args.b and args.a_env == args.b_env and venvs["a"] == venvs["b"]:
        parser.error("the two arms are the same: give --b (a ref), --b-env or --b-venv")
    runs = order(args.pairs)  # validates --pairs
    command, figures_of, rate_of, what = {
        "execution": (["execution", "--exec-jobs", str(args.exec_jobs)], figures,
                      _execution_rate, f"{args.exec_jobs:,} jobs end to end"),
        "ingest": (["ingest", "--submit-only", "--jobs", str(args.jobs)], submit_figures,
                   _submit_rate, f"the submit of {args.jobs:,} jobs"),
        "replay": (["replay", "--replay-modes", "default", "--replay-jobs",
                    str(args.replay_jobs)], replay_figures, _replay_rate,
                   f"a rebuild of {args.replay_jobs:,} jobs' log"),
    }[args.scenario]
    held = contextlib.ExitStack()  # the CPU quota, left when the runs end
    if args.cpu_quota is not None:
        try:
            held.enter_context(cpu_quota(args.cpu_quota))
        except QuotaError as e:
            parser.error(str(e))
    root = Path(tempfile.mkdtemp(prefix="hs-ab-"))
    results: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    worktrees: list[Path] = []
    try:
        arms = {}
        for name, ref, env in (("a", args.a, args.a_env), ("b", args.b, args.b_env)):
            directory, worktree = _checkout(ref, root, venvs[name])
            if worktree:
                worktrees.append(directory)
            arms[name] = Arm(name, ref, _env_pairs(env), directory)
        # Every run's files stay until the end: removing a run's 100,000 job logs taxes the
        # next run's file creation for minutes (see bench.remove_at_exit).
        steps = [runs[i:i + 2] for i in range(0, len(runs), 2)] if args.together else [
            [name] for name in runs]
        for i, step in enumerate(steps):
            started = time.strftime("%H:%M:%S")

            def start(name: str, attempt: int, i: int = i) -> tuple[Process, Path]:
                tmp = root / (f"run-{i}-{name}" + (f"-{attempt}" if attempt else ""))
                tmp.mkdir()
                log = tmp.with_suffix(".log")
                return _start(arms[name], command, args.stack, tmp, log), log

            step_results = run_step(
                step, start, lambda name, proc, log: _result(arms[name], args.scenario, proc, log))
            for name in step:
                got = step_results[name]
                results[name].append(got)
                arm = arms[name]
                print(f"{started} step {i + 1}/{len(steps)} arm {name.upper()} ({arm.ref} "
                      f"{' '.join(f'{k}={v}' for k, v in arm.env.items())}"
                      f"{''.join(f' {v}={p}' for v, p in venvs[name].items())}): "
                      f"{rate_of(got)}", flush=True)
    finally:
        held.close()
        for wt in worktrees:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(wt)],
                           check=False)
        shutil.rmtree(root, ignore_errors=True)
    compared = compare([figures_of(r) for r in results["a"]],
                       [figures_of(r) for r in results["b"]])
    table = Table(title=f"A = {args.a} {' '.join(args.a_env)}   B = {args.b} "
                        f"{' '.join(args.b_env)}   ({args.pairs} pairs, {what}"
                        + (f", held to {args.cpu_quota:g} cores" if args.cpu_quota else "")
                        + ")")
    for column in ("figure", "A", "B", "B - A", "95% interval", "", "median B - A",
                   "B higher", "verdict"):
        table.add_column(column, justify="left" if column in ("figure", "verdict") else "right")
    for p in compared:
        interval = "-" if p.ci_low is None else f"{p.ci_low:+.3f} .. {p.ci_high:+.3f}"
        table.add_row(p.figure, f"{p.mean_a:.3f}", f"{p.mean_b:.3f}", f"{p.diff:+.3f}",
                      interval, f"{p.relative:+.1%}", f"{p.median_diff:+.3f}",
                      f"{p.b_higher} of {p.pairs}", p.verdict)
    Console(width=160).print(table)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ab-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({
        "scenario": args.scenario,
        "a": {"ref": args.a, "env": args.a_env}, "b": {"ref": args.b, "env": args.b_env},
        "order": runs, "together": args.together, "cpu_quota": args.cpu_quota,
        "runs": results,
        "compared": [asdict(p) for p in compared]},
        indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    stop_on_signals()  # its runs are stopped as on Ctrl-C (run_step)
    main()
