"""The audit's partition reader reads spans of the log as it already is, one after another."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import msgspec
import pytest
from aiokafka.record.default_records import DefaultRecordBase, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from core.log_gaps import GapGuard
from services.audit.logread import PartitionReader, Refetch, take_span
from services.audit.replay import spans
from services.common.log import LogError, Publisher, bootstrap_topics, high_watermarks
from services.common.settings import TOPIC_BATCH, LogSettings

from .projection_helpers import job, submission


@pytest.mark.integration
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


def _batch(base: int, n: int, *, control: bool = False) -> bytes:
    """A record batch (message format 2) of ``n`` records from offset ``base``, values
    ``b"v<offset>"``: as a broker returns one."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(n):
        builder.append(i, timestamp=1, key=None, value=b"v%d" % (base + i), headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)  # the broker's offset (outside the CRC)
    if control:  # the attributes are inside the CRC: set the flag, then the CRC again
        at, crc_at = DefaultRecordBase.ATTRIBUTES_OFFSET, DefaultRecordBase.CRC_OFFSET
        (attributes,) = struct.unpack_from(">h", data, at)
        struct.pack_into(">h", data, at, attributes | DefaultRecordBase.CONTROL_MASK)
        struct.pack_into(">I", data, crc_at, calc_crc32c(bytes(data[at:])))
    return bytes(data)


def _offsets(records: list[Any]) -> list[int]:
    assert [r.value for r in records] == [b"v%d" % r.offset for r in records]
    return [r.offset for r in records]


def test_a_fetch_is_cut_to_the_span() -> None:
    """A fetch returns whole record batches: the records before the position asked for and
    those at or past the span's end are not the span's."""
    data = _batch(0, 10) + _batch(10, 10) + _batch(20, 10)
    records, position = take_span(data, 4, 25, GapGuard())
    assert _offsets(records) == list(range(4, 25)) and position == 25
    records, position = take_span(data, 10, 100, GapGuard())
    assert _offsets(records) == list(range(10, 30)) and position == 30


def test_control_batches_are_stepped_over() -> None:
    data = _batch(0, 3) + _batch(3, 1, control=True) + _batch(4, 2)
    records, position = take_span(data, 0, 10, GapGuard())
    assert _offsets(records) == [0, 1, 2, 4, 5] and position == 6


def test_records_past_a_hole_wait_for_it() -> None:
    """A batch fetched past a hole (the stand-in broker can make a later batch readable before
    an earlier one: core.log_gaps) is held back until the hole fills, and a hole that outlasts
    the guard's patience is stepped over."""
    later = _batch(8, 4)
    records, position = take_span(_batch(0, 5) + later, 0, 12, GapGuard())
    assert _offsets(records) == [0, 1, 2, 3, 4] and position == 5  # up to the hole
    gaps: GapGuard[int] = GapGuard(patience_s=60)
    with pytest.raises(Refetch, match="from 5 to 7"):
        take_span(later, 5, 12, gaps)
    records, position = take_span(_batch(5, 3) + later, 5, 12, gaps)  # filled
    assert _offsets(records) == list(range(5, 12)) and position == 12
    impatient: GapGuard[int] = GapGuard(patience_s=0.0)  # a gap for good
    with pytest.raises(Refetch):  # first seen: fetched again
        take_span(later, 5, 12, impatient)
    records, position = take_span(later, 5, 12, impatient)
    assert _offsets(records) == list(range(8, 12)) and position == 12


def test_a_corrupt_batch_is_fetched_again() -> None:
    data = bytearray(_batch(0, 3))
    data[-1] ^= 0xFF
    with pytest.raises(Refetch, match="CRC"):
        take_span(bytes(data), 0, 3, GapGuard())


@pytest.mark.integration
def test_spans_inside_record_batches(log_settings: LogSettings) -> None:
    """Spans that start and end inside the producer's record batches read exactly their
    records, in chunks of at most ``max_records``; a span past the log's end is an error (at
    once from Kafka, which answers that the offset is out of range; after the stall timeout
    from the stand-in broker, which answers with no records)."""
    settings = msgspec.structs.replace(log_settings, partitions=1)

    async def main() -> None:
        await bootstrap_topics(settings, [TOPIC_BATCH])
        async with Publisher(settings) as pub:
            for b in range(1, 6):  # a few produce requests: several record batches
                await pub.publish_many(submission(b, 1, [job(j) for j in range(1, 40)],
                                                  create=True))
        end = (await high_watermarks(settings, [TOPIC_BATCH]))[(TOPIC_BATCH, 0)]
        assert end >= 15
        async with PartitionReader(settings, max_records=4) as reader:
            whole = [m async for chunk in reader.read(TOPIC_BATCH, 0, 0, end) for m in chunk]
            assert [m.offset for m in whole] == list(range(end))
            for start, stop in [(1, end - 1), (end // 2, end // 2 + 1), (3, 9), (0, end)]:
                chunks = [c async for c in reader.read(TOPIC_BATCH, 0, start, stop)]
                assert all(0 < len(c) <= 4 for c in chunks)
                got = [(m.offset, m.value) for c in chunks for m in c]
                assert got == [(m.offset, m.value) for m in whole[start:stop]]
        async with PartitionReader(settings, stall_timeout_s=0.5) as reader:
            with pytest.raises(LogError, match=f"(no offset|nothing past offset) {end + 5}"):
                async for _ in reader.read(TOPIC_BATCH, 0, end + 5, end + 9):
                    pass

    asyncio.run(main())
