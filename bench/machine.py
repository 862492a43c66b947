"""How fast this machine runs Python when a benchmark starts and ends, so runs compare.

The machine is a shared VM whose speed varies by the hour: on 2026-11-27 the same code cost
1.2-1.4 ms of CPU per no-op job end to end in the afternoon and 3.3 ms the next morning, and
its rate moved with it (1,215-1,380 vs 554-574 jobs/s). A figure says little about the code
without the machine's speed beside it. The probe is a fixed pure-Python loop (integer
arithmetic and dict stores, the interpreter work our services mostly do), timed best of a few
rounds so a momentary stall does not count; the figure is millions of iterations per second.
"""

from __future__ import annotations

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
    """Millions of iterations per second of the probe loop, the best of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        _loop(iterations)
        best = min(best, time.perf_counter() - t0)
    return iterations / best / 1e6
