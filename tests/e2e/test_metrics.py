"""/metrics of every service on the running system: a small batch moves the SJ, MJS and MJC
counters, the projector's applied counter and the ingest request counter; lag returns to 0."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from schemas import topics
from schemas.infra import InstanceActivated
from services.common.log import ConsumerOptions, LogConsumer, high_watermarks
from services.common.metrics import parse_samples, total
from services.common.settings import DatabaseSettings

from .conftest import SCHEDULER_ENV, System, start_system, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
N_JOBS = 12


@pytest.fixture(scope="module")
def system(broker: str, migrated_db: DatabaseSettings,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("metrics"),
                            scheduler_env=SCHEDULER_ENV,
                            completions_env={"HS_COMPLETIONS_CALLBACKS": "false"})


def scrape(url: str) -> dict[Any, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse_samples(resp.read().decode())


def worker_addresses(system: System) -> list[str]:
    """Every worker address announced on the scheduler topic."""
    async def read() -> list[str]:
        marks = await high_watermarks(system.log, [topics.SCHEDULER])
        out: list[str] = []
        async with LogConsumer(system.log, ConsumerOptions(
                name="metrics-test", topics=[topics.SCHEDULER], group=False)) as consumer:
            seen: dict[tuple[str, int], int] = {}
            while any(seen.get(tp, 0) < end for tp, end in marks.items()):
                for r in await consumer.next_batch():
                    seen[(r.topic, r.partition)] = r.offset + 1
                    if isinstance(r.envelope.event, InstanceActivated):
                        out.append(r.envelope.event.address)
        return out
    return asyncio.run(read())


def test_every_service_exports_what_a_batch_did(system: System) -> None:
    ports = system.metrics_ports
    urls = {"ingest": f"{system.url}/metrics",
            "projector": f"http://127.0.0.1:{ports['projector']}/metrics",
            "scheduler": f"http://127.0.0.1:{ports['scheduler-a']}/metrics",
            "completions": f"http://127.0.0.1:{ports['completions']}/metrics"}
    before = {name: scrape(url) for name, url in urls.items()}
    assert total(before["scheduler"], "hs_scheduler_leader", scheduler_id="scheduler-a") == 1

    r = system.hail("many_noops", str(N_JOBS))
    assert r["batch"]["complete"] is True and r["batch"]["n_succeeded"] == N_JOBS

    def moved(service: str, after: dict[Any, float], name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before[service], name, **labels)

    scheduler = scrape(urls["scheduler"])
    assert moved("scheduler", scheduler, "hs_scheduler_sj_published_total") >= N_JOBS
    assert total(scheduler, "hs_scheduler_instances", state="active") >= 1
    assert total(scheduler, "hs_scheduler_ready_cores_mcpu") == 0
    assert total(scheduler, "hs_scheduler_round_seconds_count") > 0
    assert total(scheduler, "hs_scheduler_epoch", scheduler_id="scheduler-a") >= 1

    # Workers: each serves /metrics on its own port; together they ran every job.
    workers = [scrape(f"http://{a}/metrics") for a in worker_addresses(system)]
    assert workers
    # A start is an MJS of its own, or (a job that ended within 100 ms) part of its MJC.
    assert sum(total(w, "hs_worker_mjs_published_total") + total(w, "hs_worker_mjs_coalesced_total")
               for w in workers) >= N_JOBS
    assert sum(total(w, "hs_worker_mjc_published_total", state="Success")
               for w in workers) >= N_JOBS
    assert sum(total(w, "hs_worker_spawn_seconds_count") for w in workers) >= N_JOBS
    assert sum(total(w, "hs_worker_running_attempts") for w in workers) == 0

    ingest = scrape(urls["ingest"])
    assert moved("ingest", ingest, "hs_ingest_events_appended_total") >= 1
    routes = {dict(labels).get("route") for (name, labels) in ingest
              if name == "hs_ingest_requests_total"}
    assert any(r is not None and "{batch_id}" in r for r in routes), routes
    assert not any(r is not None and any(c.isdigit() for c in r.split("/")[-1])
                   for r in routes if r != "unmatched")

    last: list[dict[Any, float]] = []

    def projector_done() -> dict[Any, float] | None:
        s = scrape(urls["projector"])
        last[:] = [s]
        lags = [v for (n, _), v in s.items() if n == "hs_projector_lag"]
        # A worker publishes the MJCs that end together as one record per batch.
        done = sum(moved("projector", s, "hs_projector_events_applied_total", type=t)
                   for t in ("job.completed", "jobs.completed")) >= 1
        return s if done and lags and not any(lags) else None

    try:
        projector = wait_for("the projector to apply every MJC and its lag to reach 0",
                             projector_done, timeout=120)
    except AssertionError:
        raise AssertionError({k: v for k, v in last[0].items()
                              if k[0].startswith("hs_projector_")}) from None
    # The batch completed (so every MJC was applied), in fewer records than jobs: a scheduling
    # round's SJs of a batch are one bunch, and so are MJCs that a worker publishes together.
    applied = {t: moved("projector", projector, "hs_projector_events_applied_total", type=t)
               for t in ("jobs.scheduled", "job.completed", "jobs.completed")}
    assert 1 <= applied["jobs.scheduled"] <= N_JOBS, applied
    assert 1 <= applied["job.completed"] + applied["jobs.completed"] <= N_JOBS, applied
    assert moved("projector", projector, "hs_projector_transactions_total") >= 1

    def relayed() -> dict[Any, float] | None:
        s = scrape(urls["completions"])
        return s if moved("completions", s, "hs_completions_outbox_relayed_total") >= 1 \
            else None

    completions = wait_for("the batch's completion to be relayed", relayed, timeout=30)
    assert total(completions, "hs_completions_callbacks_pending") == 0
