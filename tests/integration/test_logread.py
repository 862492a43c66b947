"""The audit's partition reader reads spans of the log as it already is, one after another."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from services.audit.logread import PartitionReader
from services.audit.replay import spans
from services.common.log import Publisher, bootstrap_topics, high_watermarks
from services.common.settings import TOPIC_BATCH, LogSettings

from .projection_helpers import job, submission

pytestmark = pytest.mark.integration


def test_partition_after_partition_without_waiting_for_new_records(
        log_settings: LogSettings) -> None:
    """Moving on to the next partition does not wait out a fetch the broker holds open at the
    end of the last one: aiokafka's default wait (500 ms) made each partition of a replay's
    tail cost half a second, and a bulk lane's every partition too once it read while writing.
    """
    settings = msgspec.structs.replace(log_settings, partitions=8)

    async def main() -> tuple[int, int, int, float]:
        await bootstrap_topics(settings)
        async with Publisher(settings) as pub:
            for b in range(1, 41):
                await pub.publish_many(submission(b, 1, [job(1)], create=True))
        marks = await high_watermarks(settings, [TOPIC_BATCH])
        todo = spans({}, marks, [TOPIC_BATCH])
        read = 0
        async with PartitionReader(settings) as reader:
            await reader.partitions(TOPIC_BATCH)  # connected and warm
            t0 = time.monotonic()
            for span in todo:
                async for messages in reader.read(span.topic, span.partition, span.start,
                                                  span.end):
                    read += len(messages)
                await asyncio.sleep(0.05)  # the lane folds what it read, and the reader waits
            elapsed = time.monotonic() - t0
        return len(todo), sum(span.size for span in todo), read, elapsed

    partitions, published, read, elapsed = asyncio.run(main())
    assert partitions >= 6
    assert read == published >= 40 * 3  # each batch: created, its bunch, its commit
    # With the default, about half a second a partition: 3 s or more.
    assert elapsed < 0.15 * partitions + 1.0, elapsed
