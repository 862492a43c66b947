"""The ingest service's metrics: requests by route and status, their latency, events appended.

Requests are labelled by the route's canonical path (``/api/v1alpha/batches/{batch_id}``), never
by the raw URL, so the label set is bounded by the routes; unmatched paths share one label.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter, Histogram

from services.common.metrics import counter, histogram

REQUESTS = counter("hs_ingest_requests", "HTTP requests answered, by method, route and status.",
                   ["method", "route", "status"])
LATENCY = histogram("hs_ingest_request_seconds",
                    "Time to answer an HTTP request, by method, route and status.",
                    ["method", "route", "status"])
EVENTS_APPENDED = counter("hs_ingest_events_appended",
                          "Events ingest appended to the log (writes and billing commands).")

UNMATCHED = "unmatched"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}


def _observe(method: str, route: str, status: int, seconds: float) -> None:
    key = (method, route, status)
    pair = _children.get(key)
    if pair is None:
        labels = (method, route, str(status))
        pair = _children[key] = (REQUESTS.labels(*labels), LATENCY.labels(*labels))
    pair[0].inc()
    pair[1].observe(seconds)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


@web.middleware
async def request_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts and times every request (the outermost middleware: it sees the final status)."""
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    except asyncio.CancelledError:
        status = 499  # the client went away
        raise
    finally:
        _observe(request.method, _route(request), status, time.perf_counter() - start)


def appended(n: int) -> None:
    """``n`` events were appended."""
    EVENTS_APPENDED.inc(n)
