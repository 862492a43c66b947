"""Produce and consume rates of envelopes through the log adapter.

Publishes N realistic batch events (MJC-sized envelopes, keyed over many batches) with
``Publisher.publish_many`` in chunks, then reads them back with ``LogConsumer`` and reports
events/s and MB/s each way, plus the latency of a single acknowledged publish.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgspec

from schemas import codec
from schemas.base import AttemptResource
from schemas.execution import JobCompleted
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    Publisher,
    bootstrap_topics,
    delete_topics,
)
from services.common.settings import TOPIC_BATCH, LogSettings

RES = [AttemptResource(resource="compute/n1-preemptible/1", quantity=1000),
       AttemptResource(resource="memory/n1-preemptible/1", quantity=3840)]


def event(i: int, n_keys: int) -> JobCompleted:
    return JobCompleted(batch_id=i % n_keys, job_id=i, attempt_id=f"{i:08x}",
                        instance_name="worker-std-0001", state="Success", exit_code=0,
                        start_time_ms=1_767_225_600_000, end_time_ms=1_767_225_601_000,
                        resources=RES)


async def run(settings: LogSettings, n: int = 200_000, chunk: int = 5_000,
              n_keys: int = 1_000) -> dict[str, Any]:
    settings = msgspec.structs.replace(settings, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}-")
    await bootstrap_topics(settings, [TOPIC_BATCH])
    try:
        return await _measure(settings, n, chunk, n_keys)
    finally:
        await delete_topics(settings, [TOPIC_BATCH])


async def _measure(settings: LogSettings, n: int, chunk: int, n_keys: int) -> dict[str, Any]:
    async with Publisher(settings) as pub:
        envelopes = [pub.envelope(event(i, n_keys)) for i in range(n)]
        size = sum(len(codec.encode(e)) for e in envelopes[:1000]) / 1000
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            await pub.publish_many(envelopes[start:start + chunk])
        produce_s = time.perf_counter() - t0
        singles = 200
        t0 = time.perf_counter()
        for i in range(singles):
            await pub.publish(event(n + i, n_keys))
        single_ms = (time.perf_counter() - t0) / singles * 1000
    total = n + singles
    options = ConsumerOptions(name="bench", topics=[TOPIC_BATCH], group=False, max_records=10_000)
    async with LogConsumer(settings, options) as consumer:
        got = 0
        t0 = time.perf_counter()
        while got < total:
            got += len(await consumer.next_batch())
        consume_s = time.perf_counter() - t0
    return {
        "events": n,
        "envelope_bytes": round(size),
        "partitions": settings.partitions,
        "produce_events_per_s": round(n / produce_s),
        "produce_mb_per_s": round(n * size / produce_s / 1e6, 1),
        "consume_events_per_s": round(total / consume_s),
        "consume_mb_per_s": round(total * size / consume_s / 1e6, 1),
        "single_publish_ms": round(single_ms, 2),
    }


def main(settings: LogSettings, n: int) -> dict[str, Any]:
    return asyncio.run(run(settings, n=n))
