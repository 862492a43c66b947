"""``python -m services.scheduler``: one scheduler replica (hot standby until it takes the lease).

Configured by the shared ``HS_*`` variables and ``HS_SCHEDULER_*``
(:mod:`services.scheduler.settings`). Exits 0 on SIGTERM/Ctrl-C and 3 when deposed (a newer
leader was elected or the lease was lost): its supervisor starts it again as a standby.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from services.common import eventloop
from services.common.gcpause import tune_for_service
from services.common.metrics import serve_metrics
from services.common.settings import Settings, load_settings
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.drivers import ComputeDriver, create_driver
from services.scheduler.drivers.local import LocalDriver, LocalDriverOptions
from services.scheduler.service import Scheduler
from services.scheduler.settings import SchedulerSettings, load_scheduler_settings

EXIT_DEPOSED = 3


def make_driver(settings: Settings, sched: SchedulerSettings) -> ComputeDriver:
    """The configured compute driver; local workers get the scheduler's heartbeat interval
    and worker linger."""
    if sched.driver == "local":
        worker_env = {"HS_WORKER_HEARTBEAT_S": str(sched.worker_heartbeat_s)}
        if sched.worker_linger_ms is not None:
            worker_env["HS_WORKER_LINGER_MS"] = str(sched.worker_linger_ms)
        return LocalDriver(settings, LocalDriverOptions(worker_env=worker_env))
    return create_driver(sched.driver, settings)


async def serve(settings: Settings, sched: SchedulerSettings) -> str:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    driver = make_driver(settings, sched)
    try:
        async with Scheduler(settings, sched, driver) as scheduler, serve_metrics("scheduler"):
            scheduler_metrics.STATE.watch(scheduler, sched.scheduler_id)
            logging.getLogger(__name__).info("scheduler %s standing by", sched.scheduler_id)
            return await scheduler.run(stop)
    finally:
        await driver.close()


def main() -> None:
    loop = eventloop.service_loop("scheduler")
    tune_for_service()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    why = eventloop.run(serve(load_settings(), load_scheduler_settings()), loop)
    sys.exit(EXIT_DEPOSED if why == "deposed" else 0)


if __name__ == "__main__":
    main()
