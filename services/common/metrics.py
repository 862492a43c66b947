"""Prometheus metrics: one registry per process, ``/metrics`` for aiohttp apps, and a small
metrics server for the services that have no HTTP server of their own.

Every metric is named ``hs_<service>_...`` and is defined at import time in its service's
``metrics`` module (``services/<service>/metrics.py``), in :data:`REGISTRY`; docs/metrics.md
lists them. Updates on hot paths are O(1) per batch: counters are incremented by batch counts
and labelled children are cached by the modules that use them. Values that are cheap to read
but costly to push (the scheduler's in-memory state) are read at scrape time by collectors;
values that need I/O (consumer lag, pending callbacks) are refreshed periodically by the
metrics server (:class:`MetricsServer`, ``refresh``).

Where ``/metrics`` is served:

| service | port | variable |
|---|---|---|
| ingest | its API port | ``HS_INGEST_PORT`` / ``--port`` |
| worker | its API port | ``HS_WORKER_PORT`` |
| projector | 9101 | ``HS_METRICS_PORT`` |
| scheduler | 9102 | ``HS_METRICS_PORT`` |
| completions | 9103 | ``HS_METRICS_PORT`` |

``HS_METRICS_PORT=0`` disables the metrics server (and its periodic refreshes);
``HS_METRICS_HOST`` is the address it binds (default ``127.0.0.1``; ``0.0.0.0`` in a pod). A
port already in use is logged and the service runs without metrics: two replicas on one host
must not kill each other over a port. The same server answers ``GET /healthz`` (200, or 503
while the service's ``health`` callable says it is unhealthy).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Self

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

log = logging.getLogger(__name__)

# ``*_created`` series double the output and nobody graphs them.
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry()
"""This process's registry: every ``hs_*`` metric, plus process, platform and GC metrics."""
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

DEFAULT_PORTS: Mapping[str, int] = {"projector": 9101, "scheduler": 9102, "completions": 9103}
"""Default ``HS_METRICS_PORT`` of the services without an HTTP server of their own."""

METRIC_MODULES = ("services.ingest.metrics", "services.projector.metrics",
                  "services.scheduler.metrics", "services.worker.metrics",
                  "services.completions.metrics")
"""The modules that define the ``hs_*`` metrics (imported by :func:`exported_names`)."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
"""Seconds: from a cached read to a request that waits for the projector."""


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    """A counter in :data:`REGISTRY` (exported as ``{name}_total``)."""
    return Counter(name, documentation, labels, registry=REGISTRY)


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
    """A gauge in :data:`REGISTRY`."""
    return Gauge(name, documentation, labels, registry=REGISTRY)


def histogram(name: str, documentation: str, labels: Sequence[str] = (), *,
              buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
    """A histogram in :data:`REGISTRY`."""
    return Histogram(name, documentation, labels, registry=REGISTRY, buckets=buckets)


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "summary": ("_count", "_sum", ""), "info": ("_info",)}


def exported_names(registry: CollectorRegistry = REGISTRY, *, load: bool = True) -> set[str]:
    """Every series name ``registry`` exports (``hs_x_total``, ``hs_y_bucket``, ...).

    With ``load``, the modules of :data:`METRIC_MODULES` are imported first, so the set covers
    every service's metrics whatever this process is.
    """
    if load:
        for module in METRIC_MODULES:
            importlib.import_module(module)
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


Sample = tuple[str, frozenset[tuple[str, str]]]


def parse_samples(text: str) -> dict[Sample, float]:
    """Every sample of a Prometheus text exposition: (name, labels) -> value."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def total(samples: Mapping[Sample, float], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def render(accept: str = "") -> tuple[bytes, str]:
    """The registry in the exposition format ``accept`` asks for: (body, content type)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(REGISTRY), content_type


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``. Rendered on the event loop: collectors read in-memory state that only
    the loop mutates, and a render is a few milliseconds."""
    body, content_type = render(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_metrics_route(app: web.Application) -> None:
    """Mount ``GET /metrics`` on an aiohttp app (no authentication: see docs/metrics.md)."""
    app.router.add_get("/metrics", metrics_handler)


def metrics_port(service: str, env: Mapping[str, str] | None = None) -> int | None:
    """The port of ``service``'s metrics server from ``HS_METRICS_PORT`` (its default port
    when unset); None when it is ``0`` (disabled)."""
    env = os.environ if env is None else env
    raw = env.get("HS_METRICS_PORT")
    if raw is None or raw == "":
        return DEFAULT_PORTS[service]
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"HS_METRICS_PORT: expected a port number, got {raw!r}") from None
    return None if port == 0 else port


def metrics_host(env: Mapping[str, str] | None = None) -> str:
    """The address metrics servers bind: ``HS_METRICS_HOST``, default ``127.0.0.1``."""
    env = os.environ if env is None else env
    return env.get("HS_METRICS_HOST") or "127.0.0.1"


Refresh = Callable[[], Awaitable[object]]


class MetricsServer:
    """``/metrics`` and ``/healthz`` on their own port; an async context manager.

    ``port`` 0 binds a free port (tests; see :attr:`port`). ``refresh`` pairs an interval in
    seconds with a coroutine function that updates gauges needing I/O; each runs at start and
    then every interval while the server runs; an error in one is logged and retried at its
    next interval. ``health`` (optional) decides ``/healthz``.
    """

    def __init__(self, port: int, *, host: str = "127.0.0.1",
                 refresh: Iterable[tuple[float, Refresh]] = (),
                 health: Callable[[], bool] | None = None) -> None:
        self._host = host
        self._wanted = port
        self._refresh = list(refresh)
        self._health = health
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port: int | None = None
        """The bound port once started (None if binding failed)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application()
        add_metrics_route(app)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._wanted)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            log.warning("metrics server not started on %s:%d: %s", self._host, self._wanted, e)
            return
        self._runner = runner
        self.port = int(runner.addresses[0][1]) if runner.addresses else self._wanted
        log.info("metrics on http://%s:%d/metrics", self._host, self.port)
        self._tasks = [asyncio.create_task(_every(interval, fn), name=f"metrics-{fn.__name__}")
                       for interval, fn in self._refresh]

    async def stop(self) -> None:
        """Stop refreshing and serving. Idempotent."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        ok = self._health is None or self._health()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy\n")


async def _every(interval: float, fn: Refresh) -> None:
    while True:
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a refresh loop's top level: report, keep the service up
            log.warning("metrics refresh %s failed: %s", fn.__name__, e)
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def serve_metrics(service: str, *, refresh: Iterable[tuple[float, Refresh]] = (),
                        health: Callable[[], bool] | None = None,
                        env: Mapping[str, str] | None = None
                        ) -> AsyncIterator[MetricsServer | None]:
    """The metrics server of ``service`` as configured by the environment (None: disabled)."""
    port = metrics_port(service, env)
    if port is None:
        yield None
        return
    async with MetricsServer(port, host=metrics_host(env), refresh=refresh,
                             health=health) as server:
        yield server
