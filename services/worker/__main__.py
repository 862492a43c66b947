"""``python -m services.worker``: run the worker of this instance until SIGTERM or Ctrl-C.

Configured by the shared ``HS_*`` variables (the log) plus:

| variable | default |
|---|---|
| ``HS_WORKER_INSTANCE_NAME`` | the host name |
| ``HS_WORKER_PORT`` | 5001 |
| ``HS_WORKER_CORES_MCPU`` | 1000 per CPU |
| ``HS_WORKER_LOG_DIR`` | the shared log root: ``HS_LOG_DIR``, else ``{HS_DATA_DIR}/job-logs`` |
| ``HS_WORKER_SPEC_DIR`` | the spec root: ``HS_SPEC_DIR``, else ``{HS_DATA_DIR}/specs`` |
| ``HS_WORKER_HEARTBEAT_S`` | 60 |
| ``HS_WORKER_REPORT_RETRY_S`` | 1 |
| ``HS_WORKER_SHUTDOWN_REPORT_S`` | 10 |
| ``HS_WORKER_REGION`` | none |
| ``HS_WORKER_SCRATCH_DIR`` | the system's temporary directory |
| ``HS_WORKER_HOST`` | 127.0.0.1 (the interface to listen on; 0.0.0.0 on a cloud VM) |
| ``HS_WORKER_ADVERTISE_HOST`` | ``HS_WORKER_HOST`` (the host announced to the scheduler) |
| ``HS_WORKER_LINGER_MS`` | 15 (how long MJS/MJC wait to share a produce request) |
| ``HS_WORKER_START_REPORT_MS`` | 1000 (an attempt that ends sooner has no MJS: its MJC says it) |
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Mapping

from services.common import eventloop
from services.common.cpus import usable_cores
from services.common.gcpause import tune_for_service
from services.common.settings import (
    LogSettings,
    Settings,
    load_settings,
    log_root,
    pick_env,
    spec_root,
)
from services.worker.service import Worker, WorkerSettings

_WORKER_ENV = {
    "HS_WORKER_INSTANCE_NAME": ("instance_name", str),
    "HS_WORKER_PORT": ("port", int),
    "HS_WORKER_CORES_MCPU": ("cores_mcpu", int),
    "HS_WORKER_LOG_DIR": ("log_dir", str),
    "HS_WORKER_SPEC_DIR": ("spec_dir", str),
    "HS_WORKER_HEARTBEAT_S": ("heartbeat_s", float),
    "HS_WORKER_REPORT_RETRY_S": ("report_retry_s", float),
    "HS_WORKER_SHUTDOWN_REPORT_S": ("shutdown_report_s", float),
    "HS_WORKER_REGION": ("region", str),
    "HS_WORKER_SCRATCH_DIR": ("scratch_dir", str),
    "HS_WORKER_HOST": ("host", str),
    "HS_WORKER_ADVERTISE_HOST": ("advertise_host", str),
    "HS_WORKER_LINGER_MS": ("linger_ms", int),
    "HS_WORKER_START_REPORT_MS": ("start_report_ms", int),
}


def load_worker_settings(env: Mapping[str, str] | None = None, *,
                         data_dir: str = "var") -> WorkerSettings:
    """The worker's settings from ``HS_WORKER_*`` in ``env`` (default: the environment).

    Logs and specs default to the shared roots (``HS_LOG_DIR``, ``HS_SPEC_DIR``, else under
    ``data_dir``), where ingest reads the logs and writes the specs.
    """
    env = os.environ if env is None else env
    fields = pick_env(env, _WORKER_ENV)
    fields.setdefault("instance_name", socket.gethostname())
    fields.setdefault("port", 5001)
    # The cores this process may use: a container's CPU limit counts (core.cpu_capacity).
    fields.setdefault("cores_mcpu", 1000 * usable_cores())
    shared = Settings(data_dir=data_dir, spec_dir=env.get("HS_SPEC_DIR") or None,
                      log_dir=env.get("HS_LOG_DIR") or None)
    fields.setdefault("log_dir", log_root(shared))
    fields.setdefault("spec_dir", spec_root(shared))
    return WorkerSettings(**fields)  # type: ignore[arg-type]


async def serve(settings: WorkerSettings, log_settings: LogSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(settings, log_settings) as worker:
        logging.getLogger(__name__).info("worker %s listening on %s", settings.instance_name,
                                         worker.address)
        await stop.wait()


def main() -> None:
    loop = eventloop.service_loop("worker")
    tune_for_service()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    shared = load_settings()
    settings = load_worker_settings(data_dir=shared.data_dir)
    with contextlib.suppress(KeyboardInterrupt):
        eventloop.run(serve(settings, shared.log), loop)


if __name__ == "__main__":
    main()
