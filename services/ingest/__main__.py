"""``python -m services.ingest [--port N]``: serve the REST API until stopped.

Job specs are written under ``HS_SPEC_DIR`` (default ``{HS_DATA_DIR}/specs``); job logs are read
from ``HS_LOG_DIR`` (default ``{HS_DATA_DIR}/logs``), where workers write them; with
``HS_STORAGE_URL=gs://...`` both live in GCS instead (:mod:`services.common.storage`).

A write answers once the projector has applied it (read-your-writes), or after
``HS_INGEST_WAIT_S`` seconds (default 4) with the event safely on the log. The bound stays
under the official client's default request timeout (5 s): past it, hailtop retries, and a
retried commit of an update the first request committed is a 400 ("already committed").
A job bunch answers once the projector is at most ``HS_INGEST_BUNCH_SLACK`` records (default
512) short of it, and the commit of an update whose jobs all came through this process once it
is on the log: a read of that batch waits (same bound) for the projector instead.
The bunches of an update reuse, for ``HS_INGEST_UPDATE_CHECK_TTL_S`` seconds (default 1; 0
checks every bunch), the check of the batch and update that an earlier bunch made.
Ingest's producer lingers ``HS_INGEST_LINGER_MS`` (default 0) before it sends, whatever
``HS_KAFKA_LINGER_MS`` says for the other services (see :func:`publisher_settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping

import msgspec
import sqlalchemy as sa
from aiohttp import web

from core.resources import default_config
from services.common import eventloop
from services.common.gcpause import tune_for_service
from services.common.log import Publisher
from services.common.settings import (
    BUNCH_SLACK_ENV,
    LogSettings,
    bunch_slack,
    load_settings,
    log_root,
    projector_consumer,
    spec_root,
)
from services.common.storage import open_log_store, open_spec_store
from services.ingest.app import create_app
from services.ingest.billing import Billing
from services.ingest.commands import BUNCH_SLACK, UPDATE_CHECK_TTL_S, Commands
from services.ingest.store import Store

INGEST_LINGER_MS = 0
"""Every ingest request waits for its events' acks before it answers, so a linger is latency on
each request; what arrives while a send is in flight is batched anyway. Sent at once, a bunch's
event was acked in 1-2 ms instead of 6-7 (lingering 5 ms, unloaded, measured), and a request
of the 1M hailtop submit holds one of the client's six connections that much less."""


def publisher_settings(log: LogSettings, env: Mapping[str, str]) -> LogSettings:
    """The log settings of ingest's producer: ``HS_INGEST_LINGER_MS`` (default
    :data:`INGEST_LINGER_MS`) in place of the services' shared linger."""
    linger = env.get("HS_INGEST_LINGER_MS", "").strip()
    if linger and not linger.isdigit():
        raise ValueError(f"HS_INGEST_LINGER_MS: expected whole milliseconds; got {linger!r}")
    return msgspec.structs.replace(log, linger_ms=int(linger) if linger else INGEST_LINGER_MS)


async def serve(host: str, port: int) -> None:
    settings = load_settings()
    engine = sa.create_engine(settings.db.url(), pool_size=settings.db.pool_size,
                              pool_pre_ping=True)
    store = Store(engine, projector_consumer(settings.log))
    try:
        async with Publisher(publisher_settings(settings.log, os.environ)) as publisher:
            wait_s = float(os.environ.get("HS_INGEST_WAIT_S", "4"))
            slack = bunch_slack(os.environ.get(BUNCH_SLACK_ENV) or str(BUNCH_SLACK))
            commands = Commands(store, publisher, default_config(), wait_s=wait_s,
                                specs=open_spec_store(spec_root(settings)), bunch_slack=slack,
                                update_check_ttl_s=float(os.environ.get(
                                    "HS_INGEST_UPDATE_CHECK_TTL_S", str(UPDATE_CHECK_TTL_S))))
            app = create_app(store, commands, Billing(store, publisher, wait_s=wait_s),
                             logs=open_log_store(log_root(settings)))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, host, port).start()
            logging.getLogger(__name__).info("ingest listening on %s:%d", host, port)
            try:
                await asyncio.Event().wait()
            finally:
                await runner.cleanup()
    finally:
        engine.dispose()


def main() -> None:
    loop = eventloop.service_loop("ingest")
    tune_for_service()
    parser = argparse.ArgumentParser(prog="python -m services.ingest")
    parser.add_argument("--port", type=int, default=int(os.environ.get("HS_INGEST_PORT", "5000")))
    # Loopback by default (the local stack); 0.0.0.0 in a container or pod.
    parser.add_argument("--host", default=os.environ.get("HS_INGEST_HOST", "127.0.0.1"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(serve(args.host, args.port), loop)


if __name__ == "__main__":
    main()
