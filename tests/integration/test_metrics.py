"""Metrics on the real broker and MariaDB: the metrics server, the ingest middleware, the
projector's applied counters and consumer lag (in process and as a process)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from services.common import procs
from services.common.log import Publisher, bootstrap_topics
from services.common.metrics import MetricsServer, parse_samples, total
from services.common.offsets import MySQLOffsetStore
from services.common.settings import DatabaseSettings, LogSettings, projector_consumer
from services.ingest.metrics import request_metrics
from services.projector.app import PROJECTED_TOPICS
from services.projector.metrics import LagProbe

from .projection_helpers import job, query, submission

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


async def _get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_metrics_server_serves_prometheus_text_refreshes_and_health() -> None:
    refreshed = 0
    healthy = True
    fourth = asyncio.Event()

    async def refresh() -> None:
        nonlocal refreshed
        refreshed += 1
        if refreshed >= 4:
            fourth.set()
        if refreshed == 2:
            raise RuntimeError("a failing refresh is retried, not fatal")

    async with MetricsServer(0, refresh=[(0.05, refresh)], health=lambda: healthy) as server:
        assert server.port
        base = f"http://127.0.0.1:{server.port}"
        status, content_type, text = await _get(f"{base}/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        samples = parse_samples(text)  # the official parser accepts the whole exposition
        names = {name for name, _ in samples}
        assert {"hs_projector_transactions_total", "hs_ingest_events_appended_total",
                "process_cpu_seconds_total", "python_info"} <= names
        async with asyncio.timeout(5):
            await fourth.wait()  # kept refreshing after the failure
        assert (await _get(f"{base}/healthz"))[0] == 200
        healthy = False
        assert (await _get(f"{base}/healthz"))[0] == 503

        # A port already taken: logged, the service goes on without metrics.
        async with MetricsServer(server.port) as clash:
            assert clash.port is None
    count = refreshed
    await asyncio.sleep(0.2)
    assert refreshed == count  # stopping stopped the refresh loop


async def test_ingest_middleware_labels_requests_by_route_not_url() -> None:
    async def item(request: web.Request) -> web.Response:
        if request.match_info["item_id"] == "404":
            raise web.HTTPNotFound()
        return web.Response(text="ok")

    app = web.Application(middlewares=[request_metrics])
    app.router.add_get("/things/{item_id}", item)
    from services.common.metrics import add_metrics_route

    add_metrics_route(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    try:
        before = parse_samples((await _get(f"{base}/metrics"))[2])
        for path in ("/things/1", "/things/2", "/things/404", "/nowhere/at/all"):
            await _get(base + path)
        after = parse_samples((await _get(f"{base}/metrics"))[2])
    finally:
        await runner.cleanup()

    def moved(**labels: str) -> float:
        return (total(after, "hs_ingest_requests_total", **labels)
                - total(before, "hs_ingest_requests_total", **labels))

    assert moved(route="/things/{item_id}", status="200", method="GET") == 2
    assert moved(route="/things/{item_id}", status="404") == 1
    assert moved(route="unmatched", status="404") == 1
    routes = {dict(ls)["route"] for n, ls in after if n == "hs_ingest_requests_total"}
    assert not any(r.startswith("/things/") and "{" not in r for r in routes)
    assert (total(after, "hs_ingest_request_seconds_count", route="/things/{item_id}")
            - total(before, "hs_ingest_request_seconds_count", route="/things/{item_id}")) == 3


def _env(log: LogSettings, db: DatabaseSettings, metrics_port: int) -> dict[str, str]:
    return {**os.environ, "HS_KAFKA_BOOTSTRAP": log.bootstrap_servers,
            "HS_TOPIC_PREFIX": log.topic_prefix, "HS_KAFKA_PARTITIONS": str(log.partitions),
            "HS_DB_NAME": db.name, "HS_DB_HOST": db.host, "HS_DB_PORT": str(db.port),
            "HS_METRICS_PORT": str(metrics_port)}


@pytest.fixture
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    try:
        yield engine
    finally:
        engine.dispose()


async def _scrape(port: int) -> dict[Any, float]:
    status, _, text = await _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return parse_samples(text)


async def _eventually(what: str, check: Any, within_s: float = 90) -> Any:
    deadline = time.monotonic() + within_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last[0]:
            return last[1]
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; last saw {last!r}")


@pytest.mark.slow
async def test_projector_counts_applied_events_and_its_lag_returns_to_zero(
        log_settings: LogSettings, migrated_db: DatabaseSettings, engine: sa.Engine,
        tmp_path: Path) -> None:
    await bootstrap_topics(log_settings)
    n_batches = 6
    events = []
    for b in range(1, n_batches + 1):
        events += submission(b, 1, [job(1), job(2, 0, [1]), job(3)], create=True)
    async with Publisher(log_settings) as pub:
        positions = await pub.publish_many(events)
    per_partition: dict[tuple[str, int], int] = {}
    for p in positions:
        per_partition[(p.topic, p.partition)] = per_partition.get((p.topic, p.partition), 0) + 1

    # Before any projector ran, the lag of every partition is its whole length.
    consumer = projector_consumer(log_settings)
    probe = LagProbe(log_settings, MySQLOffsetStore(engine), consumer, PROJECTED_TOPICS)
    lag = await probe.refresh()
    assert {tp: n for tp, n in lag.items() if n} == per_partition
    assert set(lag) == {(t, p) for t in PROJECTED_TOPICS for p in range(log_settings.partitions)}

    port = procs.free_port()
    proc = procs.spawn([sys.executable, "-m", "services.projector"],
                       log_path=tmp_path / "projector.log",
                       env=_env(log_settings, migrated_db, port), cwd=REPO)
    try:
        procs.wait_for_port(port, timeout=60, proc=proc, what="projector metrics")

        async def applied() -> tuple[bool, dict[Any, float]]:
            s = await _scrape(port)
            return total(s, "hs_projector_events_applied_total") >= len(events), s

        samples = await _eventually("the applied counter", applied)
        assert total(samples, "hs_projector_events_applied_total") == len(events)
        assert total(samples, "hs_projector_events_applied_total", type="batch.created") \
            == n_batches
        assert query(engine, "SELECT COUNT(*) FROM batches") == [(n_batches,)]
        transactions = total(samples, "hs_projector_transactions_total")
        assert 1 <= transactions <= len(events)
        assert total(samples, "hs_projector_records_per_transaction_count") == transactions
        assert total(samples, "hs_projector_records_per_transaction_sum") == len(events)

        async def caught_up() -> tuple[bool, dict[Any, float]]:
            s = await _scrape(port)
            lags = {dict(ls)["partition"]: v for (n, ls), v in s.items()
                    if n == "hs_projector_lag" and dict(ls)["topic"] == "batch-events"}
            return len(lags) == log_settings.partitions and not any(lags.values()), s

        samples = await _eventually("the lag to reach 0 on every partition", caught_up)
        assert total(samples, "hs_projector_lag_refreshed_timestamp_seconds") > 0
    finally:
        procs.terminate(proc.pid)
        proc.wait(timeout=30)
