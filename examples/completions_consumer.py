"""An example downstream consumer of the completions topic: prints each completion as JSON.

    .venv/bin/python examples/completions_consumer.py                  # the local stack
    .venv/bin/python examples/completions_consumer.py --group billing-report --from earliest

It joins a Kafka consumer group (several copies share the partitions), decodes each record with
the project's codec (msgpack envelopes; see docs/completions.md for the fields) and prints one
JSON line per completion. Offsets are committed only after the lines are printed, so a crash
prints some completions again rather than losing any: at least once. Completions can also be
published more than once by the service itself; the envelope's ``event_id`` is the same for every
copy of one completion, so the consumer drops copies it has already seen.

Settings: ``--bootstrap`` (default ``HS_KAFKA_BOOTSTRAP`` or 127.0.0.1:9092) and
``--topic-prefix`` (default ``HS_TOPIC_PREFIX``), as every service reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import OrderedDict

from aiokafka import AIOKafkaConsumer

from schemas import codec
from schemas.batch import BatchCompleted, JobGroupCompleted
from schemas.topics import COMPLETIONS

SEEN = 100_000  # event ids remembered for dropping repeats


def line(event: BatchCompleted | JobGroupCompleted, event_id: str) -> str:
    """One completion as a JSON line."""
    group = event.job_group_id if isinstance(event, JobGroupCompleted) else 0
    return json.dumps({
        "event_id": event_id, "kind": "batch" if group == 0 else "job_group",
        "batch_id": event.batch_id, "job_group_id": group, "outcome": event.outcome,
        "n_jobs": event.n_jobs, "n_succeeded": event.n_succeeded, "n_failed": event.n_failed,
        "n_cancelled": event.n_cancelled, "time_completed_ms": event.time_completed_ms})


async def consume(args: argparse.Namespace) -> None:
    consumer = AIOKafkaConsumer(
        f"{args.topic_prefix}{COMPLETIONS}", bootstrap_servers=args.bootstrap,
        group_id=args.group, enable_auto_commit=False, auto_offset_reset=args.start)
    await consumer.start()
    seen: OrderedDict[str, None] = OrderedDict()
    printed = 0
    try:
        while args.max is None or printed < args.max:
            batches = await consumer.getmany(timeout_ms=1_000)
            for records in batches.values():
                for record in records:
                    env = codec.decode(record.value)
                    event = env.event
                    if not isinstance(event, BatchCompleted | JobGroupCompleted):
                        continue  # a tag added later: not ours to interpret
                    if env.event_id in seen:
                        continue  # a repeat of a completion already printed
                    seen[env.event_id] = None
                    if len(seen) > SEEN:
                        seen.popitem(last=False)
                    print(line(event, env.event_id), flush=True)
                    printed += 1
            if batches:
                await consumer.commit()  # after printing: at least once
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap",
                        default=os.environ.get("HS_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--topic-prefix", default=os.environ.get("HS_TOPIC_PREFIX", ""))
    parser.add_argument("--group", default="completions-example",
                        help="consumer group: copies with the same group share the work")
    parser.add_argument("--from", dest="start", choices=("earliest", "latest"),
                        default="latest", help="where a new group starts")
    parser.add_argument("--max", type=int, default=None, help="exit after this many lines")
    args = parser.parse_args()
    try:
        asyncio.run(consume(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
