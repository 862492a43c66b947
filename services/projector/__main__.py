"""``python -m services.projector``: run the projector until stopped (SIGTERM or Ctrl-C)."""

from __future__ import annotations

import logging
import sys

import faust
import sqlalchemy as sa

from services.common.metrics import metrics_host, metrics_port
from services.common.settings import load_settings
from services.projector.app import create_app


def main() -> None:
    settings = load_settings()
    engine = sa.create_engine(settings.db.url(), pool_size=settings.db.pool_size,
                              pool_pre_ping=True)
    app = create_app(settings, engine, metrics_port=metrics_port("projector"),
                     metrics_host=metrics_host())
    worker = faust.Worker(app, loglevel=logging.INFO, quiet=True)
    try:
        worker.execute_from_commandline()
    finally:
        engine.dispose()
    sys.exit(0)


if __name__ == "__main__":
    main()
