"""A server that answers the official client's submission requests at once: the client's ceiling.

``python -m bench.null_server PORT`` serves the three endpoints a multi-bunch submission uses
(create the batch, post each bunch of job specs, commit the update), reads every body in full
and keeps nothing. A submission against it costs only the client (and this process, on the other
core): no real server can make the same client finish sooner on this machine.

``GET /bench/created`` answers when (seconds since the epoch) the batch was last created: the
client's first request, which it sends only once it has serialized every spec.
"""

from __future__ import annotations

import sys
import time

from aiohttp import web

CREATED = web.AppKey("created", list[float])


async def _create(request: web.Request) -> web.Response:
    request.app[CREATED].append(time.time())
    await request.read()
    return web.json_response({"id": 1, "update_id": 1, "start_job_group_id": 1,
                              "start_job_id": 1})


async def _bunch(request: web.Request) -> web.Response:
    await request.read()
    return web.Response()


async def _commit(request: web.Request) -> web.Response:
    return web.json_response({"start_job_group_id": 1, "start_job_id": 1})


async def _created(request: web.Request) -> web.Response:
    created = request.app[CREATED]
    return web.json_response({"created_at": created[-1] if created else None})


def app() -> web.Application:
    out = web.Application(client_max_size=64 * 1024 * 1024)
    out[CREATED] = []
    out.router.add_get("/bench/created", _created)
    out.router.add_post("/api/v1alpha/batches/create", _create)
    out.router.add_post("/api/v1alpha/batches/{batch}/updates/{update}/jobs/create", _bunch)
    out.router.add_patch("/api/v1alpha/batches/{batch}/updates/{update}/commit", _commit)
    return out


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), print=None)
