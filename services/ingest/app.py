"""The ingest service's web app: the Hail Batch v1alpha REST API.

Handlers are thin: parse the request, call a command or a read in :mod:`commands` /
:mod:`reads`, answer JSON. Domain errors become HTTP statuses in one middleware, with the error
text as the body (clients show it, and tests match on it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from core.errors import DomainError
from services.common.metrics import metrics_handler
from services.ingest import ui
from services.ingest.billing import Billing
from services.ingest.commands import Commands
from services.ingest.metrics import request_metrics
from services.ingest.reads import Reads
from services.ingest.store import Store, User
from services.worker.logstore import LogStore

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024 + 64 * 1024
COMMANDS = web.AppKey("commands", Commands)
READS = web.AppKey("reads", Reads)
STORE = web.AppKey("store", Store)
BILLING = web.AppKey("billing", Billing)
USER = web.RequestKey("hs_user", User)
VERSION = "0.2.139"
_decoder = msgspec.json.Decoder()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status,
                        content_type="application/json")


class _TokenCache:
    """Recently authenticated tokens, so most requests skip the database (10 s)."""

    def __init__(self, ttl_s: float = 10.0) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, User | None]] = {}

    async def user(self, store: Store, token: str) -> User | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        hit = self._entries.get(digest)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        found = await asyncio.to_thread(store.user_for_token_hash, digest)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now, found)
        return found


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except DomainError as e:
        return web.Response(status=e.status, text=e.message)
    except web.HTTPException:
        raise
    except msgspec.DecodeError as e:
        return web.Response(status=400, text=f"malformed JSON body: {e}")


def _auth(cache: _TokenCache) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return web.Response(status=401, text="not authenticated: no bearer token")
        user = await cache.user(request.app[STORE], token.strip())
        if user is None:
            return web.Response(status=401, text="not authenticated: unknown or revoked token")
        request[USER] = user
        return await handler(request)
    return auth


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return None
    return _decoder.decode(raw)


def _int(request: web.Request, name: str) -> int:
    value = request.match_info[name]
    try:
        return int(value)
    except ValueError:
        raise web.HTTPNotFound(text=f"{name} must be an integer, not {value!r}") from None


def _query_int(request: web.Request, name: str) -> int | None:
    return request.app[READS].require_int(request.query.get(name), name)


# --- submission ------------------------------------------------------------------------------
async def create_batch(request: web.Request) -> web.Response:
    return _json(await request.app[COMMANDS].create_batch(await _body(request), request[USER]))


async def create_fast(request: web.Request) -> web.Response:
    return _json(await request.app[COMMANDS].create_fast(await _body(request), request[USER]))


async def update_fast(request: web.Request) -> web.Response:
    return _json(await request.app[COMMANDS].update_fast(
        _int(request, "batch_id"), await _body(request), request[USER]))


async def open_update(request: web.Request) -> web.Response:
    return _json(await request.app[COMMANDS].open_update(
        _int(request, "batch_id"), await _body(request), request[USER]))


async def submit_groups(request: web.Request) -> web.Response:
    await request.app[COMMANDS].submit_groups(
        _int(request, "batch_id"), _int(request, "update_id"), await _body(request),
        request[USER])
    return web.Response()


async def submit_jobs(request: web.Request) -> web.Response:
    # The bunch is decoded by the core, typed (core.job_bunch): the body goes as it came.
    await request.app[COMMANDS].submit_jobs(
        _int(request, "batch_id"), _int(request, "update_id"), await request.read(),
        request[USER])
    return web.Response()


async def commit(request: web.Request) -> web.Response:
    return _json(await request.app[COMMANDS].commit(
        _int(request, "batch_id"), _int(request, "update_id"), request[USER]))


async def cancel_batch(request: web.Request) -> web.Response:
    await request.app[COMMANDS].cancel_batch(_int(request, "batch_id"), request[USER])
    return web.Response()


async def cancel_group(request: web.Request) -> web.Response:
    await request.app[COMMANDS].cancel_group(
        _int(request, "batch_id"), _int(request, "job_group_id"), request[USER])
    return web.Response()


async def delete_batch(request: web.Request) -> web.Response:
    await request.app[COMMANDS].delete_batch(_int(request, "batch_id"), request[USER])
    return web.Response()


# --- reads -----------------------------------------------------------------------------------
async def _read(request: web.Request, fn: Callable[..., Any], *args: Any) -> web.Response:
    if "batch_id" in request.match_info:  # read-your-writes for writes answered early
        await request.app[COMMANDS].settle(_int(request, "batch_id"), request[USER].name)
    return _json(await asyncio.to_thread(fn, *args))


async def get_batch(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].batch, _int(request, "batch_id"),
                       request[USER].name)


def _version(request: web.Request) -> int:
    return 2 if "/v2alpha/" in request.path else 1


async def list_batches(request: web.Request) -> web.Response:
    await request.app[COMMANDS].settle(None, request[USER].name)
    return await _read(request, request.app[READS].batches, request[USER].name,
                       request.query.get("q"), _version(request),
                       _query_int(request, "last_batch_id"))


async def get_group(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].group, _int(request, "batch_id"),
                       _int(request, "job_group_id"), request[USER].name)


async def child_groups(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].child_groups, _int(request, "batch_id"),
                       _int(request, "job_group_id"), request[USER].name,
                       _query_int(request, "last_job_group_id"))


async def list_jobs(request: web.Request) -> web.Response:
    group = int(request.match_info.get("job_group_id", "0"))
    recursive = request.query.get("recursive", "false").lower() in ("true", "1")
    return await _read(request, request.app[READS].jobs, _int(request, "batch_id"), group,
                       request[USER].name, request.query.get("q"), _version(request),
                       _query_int(request, "last_job_id"), recursive)


async def get_job(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].job, _int(request, "batch_id"),
                       _int(request, "job_id"), request[USER].name)


# --- billing projects --------------------------------------------------------------------------
async def list_projects(request: web.Request) -> web.Response:
    return await _read(request, request.app[BILLING].projects, request[USER],
                       request.query.get("status"))


async def get_project(request: web.Request) -> web.Response:
    return await _read(request, request.app[BILLING].project, request[USER],
                       request.match_info["billing_project"])


async def billing(request: web.Request) -> web.Response:
    return await _read(request, request.app[BILLING].spent, request[USER])


async def project_action(request: web.Request) -> web.Response:
    b, name = request.app[BILLING], request.match_info["billing_project"]
    action = request.match_info["action"]
    actions = {"create": b.create, "close": b.close, "reopen": b.reopen, "delete": b.delete}
    if action not in actions:
        raise web.HTTPNotFound(text=f"unknown billing project action {action!r}")
    return _json(await actions[action](request[USER], name))


async def project_user(request: web.Request) -> web.Response:
    b, name = request.app[BILLING], request.match_info["billing_project"]
    member, action = request.match_info["user"], request.match_info["action"]
    if action not in ("add", "remove"):
        raise web.HTTPNotFound(text=f"unknown billing project user action {action!r}")
    fn = b.add_user if action == "add" else b.remove_user
    return _json(await fn(request[USER], name, member))


async def edit_limit(request: web.Request) -> web.Response:
    return _json(await request.app[BILLING].edit_limit(
        request[USER], request.match_info["billing_project"], await _body(request)))


async def job_attempts(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].attempts, _int(request, "batch_id"),
                       _int(request, "job_id"), request[USER].name)


async def job_log(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].log, _int(request, "batch_id"),
                       _int(request, "job_id"), request[USER].name)


async def resource_usage(request: web.Request) -> web.Response:
    return await _read(request, request.app[READS].resource_usage, _int(request, "batch_id"),
                       _int(request, "job_id"), request[USER].name)


async def container_log(request: web.Request) -> web.Response:
    data = await asyncio.to_thread(
        request.app[READS].container_log, _int(request, "batch_id"), _int(request, "job_id"),
        request.match_info["container"], request[USER].name, request.query.get("attempt_id"))
    return web.Response(body=data, content_type="application/octet-stream")


async def healthcheck(request: web.Request) -> web.Response:
    return web.Response()


async def version(request: web.Request) -> web.Response:
    return web.Response(text=VERSION)


async def cloud(request: web.Request) -> web.Response:
    return web.Response(text="local")


async def default_region(request: web.Request) -> web.Response:
    return web.Response(text="local")


async def supported_regions(request: web.Request) -> web.Response:
    return _json(["local"])


def create_app(store: Store, commands: Commands, billing_: Billing, *,
               logs: LogStore | None = None) -> web.Application:
    """The API over ``store`` (reads), ``commands`` and ``billing_`` (writes); job logs come
    from ``logs`` (none without it), job specs from the spec store ``commands`` writes."""
    app = web.Application(client_max_size=MAX_BODY,
                          middlewares=[request_metrics, errors, _auth(_TokenCache())])
    app[STORE] = store
    app[COMMANDS] = commands
    app[READS] = Reads(store, logs, commands.specs)
    app[BILLING] = billing_
    b = "/api/v1alpha/batches"
    app.router.add_routes([
        web.get("/healthcheck", healthcheck),
        web.get("/metrics", metrics_handler),  # outside /api/: no bearer token
        web.get("/api/v1alpha/version", version),
        web.get("/api/v1alpha/cloud", cloud),
        web.get("/api/v1alpha/default_region", default_region),
        web.get("/api/v1alpha/supported_regions", supported_regions),
        web.post(f"{b}/create", create_batch),
        web.post(f"{b}/create-fast", create_fast),
        web.get(b, list_batches),
        web.get("/api/v2alpha/batches", list_batches),
        web.get(f"{b}/{{batch_id}}", get_batch),
        web.delete(f"{b}/{{batch_id}}", delete_batch),
        web.patch(f"{b}/{{batch_id}}/cancel", cancel_batch),
        web.post(f"{b}/{{batch_id}}/update-fast", update_fast),
        web.post(f"{b}/{{batch_id}}/updates/create", open_update),
        web.post(f"{b}/{{batch_id}}/updates/{{update_id}}/job-groups/create", submit_groups),
        web.post(f"{b}/{{batch_id}}/updates/{{update_id}}/jobs/create", submit_jobs),
        web.patch(f"{b}/{{batch_id}}/updates/{{update_id}}/commit", commit),
        web.get(f"{b}/{{batch_id}}/job-groups/{{job_group_id}}", get_group),
        web.get(f"{b}/{{batch_id}}/job-groups/{{job_group_id}}/job-groups", child_groups),
        web.get(f"{b}/{{batch_id}}/job-groups/{{job_group_id}}/jobs", list_jobs),
        web.get("/api/v2alpha/batches/{batch_id}/job-groups/{job_group_id}/jobs",
                list_jobs),
        web.get(f"{b}/{{batch_id}}/jobs", list_jobs),
        web.patch(f"{b}/{{batch_id}}/job-groups/{{job_group_id}}/cancel", cancel_group),
        web.get(f"{b}/{{batch_id}}/jobs/{{job_id}}", get_job),
        web.get(f"{b}/{{batch_id}}/jobs/{{job_id}}/attempts", job_attempts),
        web.get(f"{b}/{{batch_id}}/jobs/{{job_id}}/log", job_log),
        web.get(f"{b}/{{batch_id}}/jobs/{{job_id}}/resource_usage", resource_usage),
        web.get(f"{b}/{{batch_id}}/jobs/{{job_id}}/log/{{container}}", container_log),
        web.get("/api/v1alpha/billing_projects", list_projects),
        web.get("/api/v1alpha/billing_projects/{billing_project}", get_project),
        web.post("/api/v1alpha/billing_projects/{billing_project}/{action}", project_action),
        web.post("/api/v1alpha/billing_projects/{billing_project}/users/{user}/{action}",
                 project_user),
        web.post("/api/v1alpha/billing_limits/{billing_project}/edit", edit_limit),
        web.get("/api/v1alpha/billing", billing),
    ])
    ui.setup(app, store, app[READS], commands, billing_)  # the web UI under /ui
    return app
