"""The web UI's handlers: a sub-application mounted at ``/ui`` with its own session middleware.

Handlers call the same read repositories and commands as the REST API (``Reads``, ``Billing``,
``Commands``) plus the ops and spending reads, in a worker thread, and render Jinja2 templates
(autoescaped). A page request without a valid session redirects to the login page; every POST
checks the CSRF field. Domain errors become an error page with the API's status and text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from core.errors import BadRequest, DomainError, Forbidden
from services.ingest.billing import Billing
from services.ingest.commands import Commands
from services.ingest.ops import Ops
from services.ingest.reads import Reads
from services.ingest.spending import Spending
from services.ingest.store import User
from services.ingest.ui import session, views

HERE: Final = Path(__file__).parent
PREFIX: Final = "/ui"
READS = web.AppKey("ui_reads", Reads)
COMMANDS = web.AppKey("ui_commands", Commands)
BILLING = web.AppKey("ui_billing", Billing)
OPS = web.AppKey("ui_ops", Ops)
SPENDING = web.AppKey("ui_spending", Spending)
USERS = web.AppKey("ui_users", session.UserCache)
TEMPLATES = web.AppKey("ui_templates", jinja2.Environment)
CSS = web.AppKey("ui_css", bytes)
USER = web.RequestKey("ui_user", User)
TOKEN = web.RequestKey("ui_token", str)
OPS_REFRESH_S: Final = 10
# No scripts at all (the ops page refreshes with a meta tag), styles only from our CSS file.
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["usd"] = views.usd
    env.filters["time_ms"] = views.time_ms
    env.filters["ms"] = views.duration
    return env


def _page(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
    user = request.get(USER)
    token = request.get(TOKEN)
    text = request.app[TEMPLATES].get_template(name).render(
        user=user, csrf=session.csrf_for(token) if token else "", prefix=PREFIX, **context)
    return web.Response(text=text, status=status, content_type="text/html",
                        headers=_SECURITY_HEADERS)


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _public(path: str) -> bool:
    return path == f"{PREFIX}/login" or path.startswith(f"{PREFIX}/static/")


@web.middleware
async def sessions(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not _public(request.path):
        token = session.session_token(request)
        user = None if token is None else await request.app[USERS].user(token)
        if token is None or user is None:
            target = f"{PREFIX}/login?" + urlencode({"next": request.path_qs})
            response = _redirect(target)
            if token is not None:
                session.clear_session(response)  # revoked or expired: forget it
            return response
        request[USER] = user
        request[TOKEN] = token
    try:
        return await handler(request)
    except DomainError as e:
        return _page(request, "error.html", status=e.status, message=e.message)


async def _thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


def _int(request: web.Request, name: str) -> int:
    value = request.match_info[name]
    try:
        return int(value)
    except ValueError:
        raise web.HTTPNotFound(text=f"{name} must be an integer, not {value!r}") from None


def _group_id(request: web.Request) -> int:
    return _int(request, "job_group_id") if "job_group_id" in request.match_info else 0


def _query_int(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {value!r}") from None


async def _checked_form(request: web.Request) -> Any:
    """The POSTed form, after checking its CSRF field (403 without the session's value)."""
    form = await request.post()
    field = form.get(session.CSRF_FIELD)
    if not session.csrf_ok(request[TOKEN], field if isinstance(field, str) else None):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again")
    return form


# --- login ------------------------------------------------------------------------------------
async def login_form(request: web.Request) -> web.StreamResponse:
    token = session.session_token(request)
    nxt = session.safe_next(request.query.get("next"))
    if token is not None and await request.app[USERS].user(token) is not None:
        return _redirect(nxt)
    return _login_page(request, nxt, None, 200)


def _login_page(request: web.Request, nxt: str, error: str | None, status: int
                ) -> web.Response:
    nonce = session.login_nonce(request)
    response = _page(request, "login.html", status=status, next=nxt, error=error,
                     login_nonce=nonce)
    session.remember_login_nonce(response, request, nonce)
    return response


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    nxt = session.safe_next(str(form.get("next") or ""))
    nonce = form.get("_login")
    if not session.login_nonce_ok(request, nonce if isinstance(nonce, str) else None):
        return _login_page(request, nxt, "The login form expired: please try again.", 403)
    token = str(form.get("token") or "").strip()
    user = await request.app[USERS].user(token) if token else None
    if user is None:
        return _login_page(request, nxt, "Unknown, expired or revoked token.", 401)
    response = _redirect(nxt)
    session.set_session(response, request, token)
    response.del_cookie(session.LOGIN_COOKIE, path=session.COOKIE_PATH)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    await _checked_form(request)
    response = _redirect(f"{PREFIX}/login")
    session.clear_session(response)
    return response


# --- batches ----------------------------------------------------------------------------------
async def index(request: web.Request) -> web.StreamResponse:
    return _redirect(f"{PREFIX}/batches")


async def batches(request: web.Request) -> web.StreamResponse:
    user = request[USER]
    q = request.query.get("q")
    version = views.query_version(request.query.get("v"))
    last = _query_int(request, "last_batch_id")
    text = views.batch_query_text(q, version, user.name)
    error, status = None, 200
    page: dict[str, Any] = {"batches": []}
    try:
        page = await _thread(request.app[READS].batches, user.name, q, version, last)
    except BadRequest as e:
        error, status = e.message, e.status
    next_url = None
    if page.get("last_batch_id") is not None:
        next_url = f"{PREFIX}/batches?" + urlencode(
            {"q": text, "v": version, "last_batch_id": page["last_batch_id"]})
    return _page(request, "batches.html", status=status, batches=page["batches"], q=text,
                 version=version, error=error, next_url=next_url, paged=last is not None)


async def batch(request: web.Request) -> web.StreamResponse:
    user, batch_id = request[USER], _int(request, "batch_id")
    reads = request.app[READS]
    status = await _thread(reads.batch, batch_id, user.name)
    tree, cut = await _thread(views.group_tree, reads, batch_id, user.name)
    return _page(request, "batch.html", batch=status, tree=tree, tree_cut=cut,
                 cancellable=views.cancellable(status))


async def cancel(request: web.Request) -> web.StreamResponse:
    user, batch_id = request[USER], _int(request, "batch_id")
    await _checked_form(request)
    group_id = _group_id(request)
    await request.app[COMMANDS].cancel_group(batch_id, group_id, user)
    return _redirect(f"{PREFIX}/batches/{batch_id}")


async def jobs(request: web.Request) -> web.StreamResponse:
    user, batch_id = request[USER], _int(request, "batch_id")
    group_id = _group_id(request)
    reads = request.app[READS]
    q = request.query.get("q") or ""
    version = views.query_version(request.query.get("v"))
    recursive = request.query.get("recursive", "1") != "0"
    last = _query_int(request, "last_job_id")
    batch_status = await _thread(reads.batch, batch_id, user.name)
    group = await _thread(reads.group, batch_id, group_id, user.name)
    error, status = None, 200
    page: dict[str, Any] = {"jobs": []}
    try:
        page = await _thread(reads.jobs, batch_id, group_id, user.name, q, version, last,
                             recursive)
    except BadRequest as e:
        error, status = e.message, e.status
    base = (f"{PREFIX}/batches/{batch_id}/jobs" if group_id == 0
            else f"{PREFIX}/batches/{batch_id}/job-groups/{group_id}/jobs")
    next_url = None
    if page.get("last_job_id") is not None:
        next_url = base + "?" + urlencode({"q": q, "v": version, "recursive": int(recursive),
                                           "last_job_id": page["last_job_id"]})
    return _page(request, "jobs.html", status=status, batch=batch_status, group=group,
                 jobs=page["jobs"], q=q, version=version, recursive=recursive, error=error,
                 next_url=next_url, base=base, paged=last is not None)


async def job(request: web.Request) -> web.StreamResponse:
    user = request[USER]
    batch_id, job_id = _int(request, "batch_id"), _int(request, "job_id")
    data = await _thread(views.job_page, request.app[READS], batch_id, job_id, user.name)
    return _page(request, "job.html", **data)


# --- billing and ops --------------------------------------------------------------------------
async def billing(request: web.Request) -> web.StreamResponse:
    user = request[USER]
    projects = await _thread(request.app[BILLING].projects, user)
    spent = await _thread(request.app[BILLING].spent, user)
    by_day = await _thread(request.app[SPENDING].by_day, user)
    return _page(request, "billing.html", projects=projects, spent=spent, by_day=by_day,
                 daily=views.daily_totals(by_day), by_user=views.visible_users(user, spent))


async def ops(request: web.Request) -> web.StreamResponse:
    if not request[USER].is_developer:
        raise Forbidden("the ops dashboard is for developers")
    o = request.app[OPS]
    lag = await o.lag()
    rates = await _thread(o.rates)
    pools = await _thread(o.cores_by, "pool")
    users = await _thread(o.cores_by, "user")
    instances, deleted = await _thread(o.instances)
    busy = await _thread(o.busy_instances)
    cancellations = await _thread(o.cancellations)
    callbacks = await _thread(o.callbacks)
    return _page(request, "ops.html", refresh_s=OPS_REFRESH_S, rates=rates, lag=lag,
                 pools=pools, users=users, instances=instances, deleted=deleted, busy=busy,
                 cancellations=cancellations, callbacks=callbacks,
                 now_ms=time.time_ns() // 1_000_000, ago=views.ago_ms)


async def css(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[CSS], content_type="text/css",
                        headers={"Cache-Control": "max-age=300"})


def sub_app(reads: Reads, commands: Commands, billing_: Billing, ops_: Ops,
            spending: Spending, users: session.UserCache) -> web.Application:
    """The UI as an application to mount at :data:`PREFIX`."""
    app = web.Application(middlewares=[sessions])
    app[READS] = reads
    app[COMMANDS] = commands
    app[BILLING] = billing_
    app[OPS] = ops_
    app[SPENDING] = spending
    app[USERS] = users
    app[TEMPLATES] = templates()
    app[CSS] = (HERE / "static" / "ui.css").read_bytes()
    b = "/batches/{batch_id}"
    app.router.add_routes([
        web.get("/", index),
        web.get("/login", login_form),
        web.post("/login", login),
        web.post("/logout", logout),
        web.get("/static/ui.css", css),
        web.get("/batches", batches),
        web.get(b, batch),
        web.post(f"{b}/cancel", cancel),
        web.post(f"{b}/job-groups/{{job_group_id}}/cancel", cancel),
        web.get(f"{b}/jobs", jobs),
        web.get(f"{b}/job-groups/{{job_group_id}}/jobs", jobs),
        web.get(f"{b}/jobs/{{job_id}}", job),
        web.get("/billing", billing),
        web.get("/ops", ops),
    ])
    return app
