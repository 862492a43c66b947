"""A bulk lane's own Python, in one process: decode, fold, render, free, per event.

``python -m bench.lane [--jobs N] [--rounds R]`` generates the replay bench's log
(:func:`bench.replay.generate`), encodes its envelopes once, then in each round does what a
rebuild's bulk lane does with a span's records, without a broker or a database: decode them as
a bulk lane does (``codec.decode_many(..., bulk=True)``), group them by batch and fold each
(:func:`core.projection.bulk.fold_batch`), render the load files of the folded rows
(:func:`services.audit.load.lines`), then free it all. It prints the CPU of each stage per
event, the median over the rounds and its spread, and the machine's speed probe.

Why: the replay bench runs the lanes beside MariaDB and the broker on a VM whose speed moves
by a third from one run to the next; a change worth a few percent of a lane only shows here,
in alternating rounds of two versions' runs (``--rounds``), or in ``bench.ab --scenario replay
--together``. The collector is off while a round runs, as in a bulk lane (``gc_paused``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections import defaultdict
from typing import Any

from bench.machine import python_mops
from bench.replay import generate
from core.projection.bulk import ResourceLists, Timed, fold_batch
from core.projection.ops import Op
from schemas import codec
from schemas.base import BatchEvent
from schemas.envelope import wrap
from services.audit.bulk import split_loads
from services.audit.load import lines

STAGES = ("decode", "fold", "render", "free")
T0 = 1_767_225_600_000


def encoded_log(n_jobs: int, batch_size: int = 100) -> list[bytes]:
    """The replay bench's log of ``n_jobs`` jobs, each event in its envelope, as msgpack."""
    return [codec.encode(wrap(e, event_id=f"{i:032x}", time_ms=T0 + i))
            for i, e in enumerate(generate(n_jobs, batch_size))]


def one_round(datas: list[bytes]) -> dict[str, float]:
    """Seconds of CPU of each stage over ``datas``, the collector off."""
    was = gc.isenabled()
    gc.disable()
    try:
        c0 = time.process_time()
        envs = codec.decode_many(datas, heads=True, bulk=True)
        c1 = time.process_time()
        by_batch: dict[int, list[Timed]] = defaultdict(list)
        for env in envs:
            event = env.event
            if isinstance(event, BatchEvent):
                by_batch[event.batch_id].append((event, env.time_ms))
        lists: ResourceLists = {}
        ops: list[Op] = []
        for history in by_batch.values():
            folded = fold_batch(history, token=0, resource_lists=lists)
            if folded is None:
                raise RuntimeError("the bench's log holds only batches the fold takes")
            ops += folded
        c2 = time.process_time()
        _, loads = split_loads(ops)
        rendered = [lines(list(rows[0]), rows) for rows in loads.values()]
        c3 = time.process_time()
        del envs, by_batch, ops, loads, rendered, history, folded
        c4 = time.process_time()
    finally:
        if was:
            gc.enable()
    return dict(zip(STAGES, (c1 - c0, c2 - c1, c3 - c2, c4 - c3), strict=True))


def run(n_jobs: int, rounds: int) -> dict[str, Any]:
    """Per-event CPU of each stage (us): the median over ``rounds`` and its spread."""
    datas = encoded_log(n_jobs)
    one_round(datas[:1000])  # warm up: imports, caches
    results = [one_round(datas) for _ in range(rounds)]
    per_event = {s: [r[s] / len(datas) * 1e6 for r in results] for s in STAGES}
    totals = [sum(r.values()) / len(datas) * 1e6 for r in results]
    return {"jobs": n_jobs, "events": len(datas), "rounds": rounds,
            "us_per_event": {s: round(statistics.median(v), 2) for s, v in per_event.items()},
            "us_per_event_range": {s: [round(min(v), 2), round(max(v), 2)]
                                   for s, v in per_event.items()},
            "us_per_event_total": round(statistics.median(totals), 2),
            "python_mops": round(python_mops(), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lane", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    out = run(args.jobs, args.rounds)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
