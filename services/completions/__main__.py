"""``python -m services.completions``: publish completions and deliver callbacks until stopped.

Configured by the shared ``HS_*`` variables and ``HS_COMPLETIONS_*``
(:mod:`services.completions.settings`). Exits 0 on SIGTERM/Ctrl-C, 1 if a loop fails for good.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from services.common import eventloop
from services.common.gcpause import tune_for_service
from services.common.metrics import serve_metrics
from services.common.settings import Settings, load_settings
from services.completions import metrics as completions_metrics
from services.completions.service import CompletionsService
from services.completions.settings import CompletionsSettings, load_completions_settings


async def serve(settings: Settings, completions: CompletionsSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with CompletionsService(settings, completions) as service:
        assert service.store is not None
        probe = completions_metrics.PendingProbe(service.store)
        async with serve_metrics("completions", refresh=[
                (completions_metrics.PENDING_INTERVAL_S, probe.refresh)]):
            await service.run(stop)


def main() -> None:
    loop = eventloop.service_loop("completions")
    tune_for_service()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    eventloop.run(serve(load_settings(), load_completions_settings()), loop)


if __name__ == "__main__":
    main()
