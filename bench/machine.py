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

That loop runs in the core's own caches, so it does not see what the VM's neighbours do to the
caches and memory it shares with them (this host's L3 is 32 MiB for every vCPU on it), while our
services' objects span far more than that: in one session the same code cost 1.45 and 2.21 ms of
CPU per no-op job at the same probe median. The sampler times a second probe beside it, a
dependent chain of reads through 16 MiB (:func:`memory_msteps`, millions of steps per CPU
second), which does.

The probe also measures the interpreter that runs it: in the same minutes Debian's build of
Python 3.11 (PGO and LTO) read 1.2-1.3 times what pyenv's plain build of it did. The bench runs
on the venv's Python, so :func:`interpreter` names it beside the figures; the probe figures of
docs/performance.md before 2026-11-30 (from 03:40 UTC) are pyenv's.
"""

from __future__ import annotations

import array
import os
import platform
import statistics
import sys
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


CHAIN_SLOTS = 1 << 21
"""16 MiB of 8-byte slots: half the host's L3, so the chain stays cached only on a quiet host."""


def memory_chain(slots: int = CHAIN_SLOTS) -> array.array[int]:
    """Slots each holding the index of the next one to read, in one cycle through all of them.

    The order is a full-period linear congruential sequence modulo a power of two (Hull and
    Dobell: an odd increment and a multiplier of 1 modulo 4), so consecutive reads land far
    apart with no stride for the hardware prefetcher to follow.
    """
    if slots & (slots - 1):
        raise ValueError(f"the chain's length must be a power of two, not {slots}")
    mask = slots - 1
    return array.array("q", [(1103515245 * i + 12345) & mask for i in range(slots)])


def memory_msteps(chain: array.array[int], steps: int = 100_000) -> float:
    """Millions of steps per CPU second along ``chain``: each read's address is the previous
    read's value, so the reads' latency adds up instead of overlapping."""
    i = 0
    t0 = time.thread_time()
    for _ in range(steps):
        i = chain[i]
    return steps / (time.thread_time() - t0) / 1e6


class Sampler:
    """Samples :func:`python_mops` and :func:`memory_msteps` every ``every_s`` seconds in a
    thread, between :meth:`start` and :meth:`stop`."""

    def __init__(self, every_s: float = 5.0, iterations: int = 50_000,
                 chain_slots: int = CHAIN_SLOTS) -> None:
        self._every_s = every_s
        self._iterations = iterations
        self._chain_slots = chain_slots
        self._samples: list[float] = []
        self._memory: list[float] = []
        self._times: list[float] = []
        """When each sample was taken (``time.monotonic``)."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        chain = memory_chain(self._chain_slots)  # built here: about 0.3 s, off the caller
        while True:
            sample = python_mops(self._iterations, rounds=1)
            memory = memory_msteps(chain, steps=2 * self._iterations)
            self._times.append(time.monotonic())
            self._memory.append(memory)
            self._samples.append(sample)
            if self._stopped.wait(self._every_s):
                return

    def stop(self) -> dict[str, float | int]:
        """Stop sampling; the samples' median, 10th and 90th percentiles, and count."""
        self._stopped.set()
        self._thread.join()
        return summary(self._samples, self._memory)

    def since(self, t0: float, until: float = float("inf")) -> dict[str, float | int]:
        """The summary of the samples taken from ``t0`` to ``until`` (``time.monotonic``):
        the machine's speed during one scenario of a run, or one step of it, which may differ
        from the run's."""
        n = len(self._times)  # the lists grow in the thread; a sample's time is appended first
        times, samples, memory = self._times[:n], self._samples[:n], self._memory[:n]
        within = [k for k, t in enumerate(times) if t0 <= t <= until]
        return summary([samples[k] for k in within], [memory[k] for k in within])


def _percentiles(samples: list[float], name: str) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {f"{name}_median": round(statistics.median(ordered), 2),
            f"{name}_p10": at(0.1), f"{name}_p90": at(0.9)}


FRESH_BOOT_S = 15 * 60
"""How long after boot a run measures the boot, not the code (docs/performance.md, "This VM's
speed": the official client alone at half its later speed in each machine's first quarter hour,
and only part of that the host backing memory the guest touches for the first time)."""


def uptime_s(path: str = "/proc/uptime") -> float | None:
    """Seconds since the machine booted (None where the kernel does not say)."""
    try:
        with open(path, encoding="ascii") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def interpreter() -> str:
    """The Python that runs the probe (and the bench and its stack): version and binary."""
    return f"{platform.python_version()} {os.path.realpath(sys.executable)}"


def summary(samples: list[float], memory: list[float] | None = None) -> dict[str, float | int]:
    """The figures of a run's samples of both probes (empty: none)."""
    if not samples:
        return {}
    return {**_percentiles(samples, "python_mops"),
            **(_percentiles(memory, "memory_msteps") if memory else {}),
            "samples": len(samples)}
