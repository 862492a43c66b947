"""How fast this machine runs Python while a benchmark runs, so runs compare.

The machine is a shared VM whose speed varies by the hour, and by the minute in a bad hour: on
2026-11-27 the same code cost 1.2-1.4 ms of CPU per no-op job end to end in one session and
3.3 ms in another, and its rate moved with it (1,215-1,380 vs 573 jobs/s); in the slow one
this probe read 3.4 and 6.5 within twenty seconds. A figure says little about the code without
the machine's speed beside it.

The probe is a fixed pure-Python loop (integer arithmetic and dict stores, the interpreter work
our services mostly do); its figure is millions of iterations per CPU second. :class:`Sampler`
times a short round of it every few seconds from a thread of the benchmark's own process (which
mostly waits), about 1% of one core, and summarizes the samples.
"""

from __future__ import annotations

import statistics
import threading
import time

ITERATIONS = 300_000
ROUNDS = 5


def _loop(n: int) -> int:
    table: dict[int, int] = {}
    total = 0
    for i in range(n):
        table[i & 1023] = i
        total += table.get((i * 7) & 1023, i)
    return total


def python_mops(iterations: int = ITERATIONS, rounds: int = ROUNDS) -> float:
    """Millions of iterations per CPU second of the probe loop, the best of ``rounds``.

    Timed in the thread's own CPU time, not wall time: on a machine busy with the benchmark the
    probe waits for a core, and that wait is load, not the machine's speed.
    """
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        _loop(iterations)
        best = min(best, time.thread_time() - t0)
    return iterations / best / 1e6


class Sampler:
    """Samples :func:`python_mops` every ``every_s`` seconds in a thread, between
    :meth:`start` and :meth:`stop`."""

    def __init__(self, every_s: float = 5.0, iterations: int = 50_000) -> None:
        self._every_s = every_s
        self._iterations = iterations
        self._samples: list[float] = []
        self._times: list[float] = []
        """When each sample was taken (``time.monotonic``)."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            sample = python_mops(self._iterations, rounds=1)
            self._times.append(time.monotonic())
            self._samples.append(sample)
            if self._stopped.wait(self._every_s):
                return

    def stop(self) -> dict[str, float | int]:
        """Stop sampling; the samples' median, 10th and 90th percentiles, and count."""
        self._stopped.set()
        self._thread.join()
        return summary(self._samples)

    def since(self, t0: float) -> dict[str, float | int]:
        """The summary of the samples taken since ``t0`` (``time.monotonic``): the machine's
        speed during one scenario of a run, which may differ from the run's."""
        times, samples = self._times[:], self._samples[:len(self._times)]
        return summary([s for t, s in zip(times, samples, strict=False) if t >= t0])


def summary(samples: list[float]) -> dict[str, float | int]:
    """The figures of a run's samples (empty: none)."""
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"python_mops_median": round(statistics.median(ordered), 2),
            "python_mops_p10": at(0.1), "python_mops_p90": at(0.9), "samples": len(ordered)}
