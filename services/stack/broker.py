"""Kafka-protocol queries of the stack: readiness, topics, high watermarks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from services.common import log as log_module
from services.common.settings import ALL_TOPICS, LogSettings


@contextlib.asynccontextmanager
async def admin_client(log: LogSettings, *, timeout_ms: int = 5_000
                       ) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=log.bootstrap_servers,
                                client_id=f"{log.client_id}-stack",
                                request_timeout_ms=timeout_ms)
    await log_module.start_client(admin.start, admin.close)
    try:
        yield admin
    finally:
        await log_module.stop_client(admin.close)


async def wait_for_broker(log: LogSettings, *, wait_s: float) -> list[str]:
    """Retry a metadata request until the broker answers; return the topics it lists."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            async with admin_client(log) as admin:
                return list(await admin.list_topics())
        except (KafkaError, OSError) as e:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"broker at {log.bootstrap_servers} did not answer metadata "
                                   f"within {wait_s:.0f}s: {e!r}") from e
            await asyncio.sleep(0.5)


async def describe_topics(log: LogSettings) -> dict[str, int]:
    """Partition count of every (non-internal) topic."""
    async with admin_client(log) as admin:
        names = [t for t in await admin.list_topics() if not t.startswith("__")]
        if not names:
            return {}
        described: list[Any] = await admin.describe_topics(names)
    return {d["topic"]: len(d["partitions"]) for d in described
            if d.get("error_code", 0) == 0 and not d.get("is_internal", False)}


async def high_watermarks(log: LogSettings, topics: list[str]) -> dict[tuple[str, int], int]:
    """High watermarks of the logical ``topics``, keyed by logical name.

    From the shared log module, which reads them from fetch responses (ListOffsets is wrong on
    tansu, so end_offsets() must not be used).
    """
    if not topics:
        return {}
    return dict(await log_module.high_watermarks(log, topics))


async def missing_topics(log: LogSettings) -> list[str]:
    """The project's topics the broker does not list (a check that bootstrap really worked)."""
    async with admin_client(log) as admin:
        present = set(await admin.list_topics())
    return [log.topic(t) for t in ALL_TOPICS if log.topic(t) not in present]


async def bootstrap(log: LogSettings) -> list[str]:
    """Create the project's topics (idempotent); return those created now."""
    return list(await log_module.bootstrap_topics(log))
