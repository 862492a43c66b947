"""``python -m services.projector``: run the projector until stopped (SIGTERM or Ctrl-C).

``HS_PROJECTOR_BATCH_WITHIN_MS`` (default 10) is how long a batch of events waits to fill
before it is applied: longer means fewer, larger transactions (less CPU per event) and longer
read-your-writes waits (see ``services.projector.app.BATCH_WITHIN_ENV``).
``HS_PROJECTOR_EXECUTION_LINGER_MS`` (default 40) is how much longer a batch of execution
reports alone (SJ, MJS, MJC, heartbeats: nobody waits to read them) waits before it is applied
(see ``services.projector.app.EXECUTION_LINGER_ENV``).
``HS_PROJECTOR_STREAM_BUFFER`` (default 128) is how many records it reads ahead of what it
applies, per partition (see ``services.projector.app.STREAM_BUFFER``).
``HS_PROJECTOR_NICE`` (default 0) lowers the process's CPU priority by that much (0-19): on a
machine the projector shares with the request path, it then yields to ingest and catches up
after (the one-machine stack sets it; see ``services.stack.config.LOCAL_PROJECTOR_NICE``).
``HS_PROJECTOR_DB_NICE`` (default 0) lowers as much the priority of the database server's
threads that serve the projector's connections, when the server runs on this machine: its
inserts are most of the projection's CPU (see ``services.common.dbnice``; the one-machine stack
sets it to the projector's own).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import faust
import sqlalchemy as sa

from services.common import eventloop
from services.common.dbnice import nice_server_threads
from services.common.gcpause import tune_for_service
from services.common.metrics import metrics_host, metrics_port
from services.common.settings import load_settings, projector_db_nice, projector_nice
from services.projector.app import (
    batch_within_s,
    create_app,
    execution_linger_s,
    stream_buffer,
)


def main() -> None:
    loop = eventloop.new_event_loop(eventloop.service_loop("projector"))
    tune_for_service()
    settings = load_settings()
    try:
        within_s = batch_within_s(os.environ)
        linger_s = execution_linger_s(os.environ)
        buffered = stream_buffer(os.environ)
        nice = projector_nice(os.environ)
        db_nice = projector_db_nice(os.environ)
    except ValueError as e:
        sys.exit(f"projector: {e}")
    if nice:
        os.nice(nice)
    asyncio.set_event_loop(loop)  # faust's app takes the current loop
    engine = sa.create_engine(settings.db.url(), pool_size=settings.db.pool_size,
                              pool_pre_ping=True)
    nice_server_threads(engine, db_nice)
    app = create_app(settings, engine, metrics_port=metrics_port("projector"),
                     metrics_host=metrics_host(), within_s=within_s,
                     linger_s=linger_s, stream_buffer=buffered)
    worker = faust.Worker(app, loglevel=logging.INFO, quiet=True, loop=loop)
    try:
        worker.execute_from_commandline()
    finally:
        engine.dispose()
    sys.exit(0)


if __name__ == "__main__":
    main()
