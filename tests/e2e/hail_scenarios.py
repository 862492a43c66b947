"""Scenarios driven by the official hailtop client (runs under .venv-hail, not the project venv).

Usage: hail_scenarios.py SCENARIO URL TOKEN BILLING_PROJECT [ARGS...]
Prints one line of JSON with what the scenario observed; the pytest side asserts on it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from hailtop.aiocloud.common import Session
from hailtop.batch_client import aioclient


async def client(url: str, token: str, billing_project: str) -> aioclient.BatchClient:
    session = Session(credentials=aioclient.HailExplicitTokenCredentials(token))
    return aioclient.BatchClient(billing_project, url=url, session=session, headers={})


async def jobs_of(group: Any, **kwargs: Any) -> list[dict[str, Any]]:
    return [j async for j in group.jobs(**kwargs)]


def states(jobs: list[dict[str, Any]]) -> dict[int, str]:
    return {j["job_id"]: j["state"] for j in jobs}


async def create_fast_dependency(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch(attributes={"name": "dep"})
    j1 = b.create_job("ubuntu:24.04", ["true"], attributes={"name": "first"})
    b.create_job("ubuntu:24.04", ["echo", "hi"], parents=[j1])
    await b.submit(disable_progress_bar=True)
    status = await b.status()
    jobs = await jobs_of(b.get_job_group(0))
    job2 = await (await b.get_job(2)).status()
    return {"id": b.id, "fast": b._submission_info.used_fast_path, "status": status,
            "states": states(jobs), "names": [j["name"] for j in jobs], "job2": job2}


async def big_batch(c: aioclient.BatchClient, n: str) -> dict[str, Any]:
    b = c.create_batch()
    for i in range(int(n)):
        b.create_job("ubuntu:24.04", ["true"], attributes={"i": str(i)})
    t0 = time.perf_counter()
    await b.submit(disable_progress_bar=True)
    elapsed = time.perf_counter() - t0
    status = await b.status()
    group = await b.get_job_group(0).status()
    ready = await jobs_of(b.get_job_group(0), q="ready")
    return {"id": b.id, "fast": b._submission_info.used_fast_path, "status": status,
            "group": group, "n_ready_listed": len(ready), "seconds": elapsed}


async def updates(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    j1 = b.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)
    j2 = b.create_job("ubuntu:24.04", ["true"], parents=[j1])
    j3 = b.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)       # update-fast
    for _ in range(1100):                           # more than one bunch: the slow update path
        b.create_job("ubuntu:24.04", ["true"], parents=[j2])
    await b.submit(disable_progress_bar=True)
    status = await b.status()
    jobs = await jobs_of(b.get_job_group(0))
    pending = await jobs_of(b.get_job_group(0), q="pending")
    return {"id": b.id, "status": status, "first": states(jobs[:3]), "ids": [j2.job_id,
            j3.job_id], "n_pending": len(pending)}


async def groups(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    outer = b.create_job_group(attributes={"name": "outer"})
    inner = outer.create_job_group(attributes={"name": "inner"})
    other = b.create_job_group(attributes={"name": "other"})
    outer.create_job("ubuntu:24.04", ["true"])
    inner.create_job("ubuntu:24.04", ["true"])
    inner.create_job("ubuntu:24.04", ["true"])
    other.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)
    before = {"outer": await outer.status(), "inner": await inner.status()}
    children = [g.job_group_id async for g in b.get_job_group(0).job_groups()]
    recursive = await jobs_of(outer, recursive=True)
    direct = await jobs_of(outer)
    await outer.cancel()
    after = {"outer": await outer.status(), "inner": await inner.status(),
             "other": await other.status(), "batch": await b.status()}
    error = None
    try:
        await b.get_job_group(99).cancel()
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    return {"id": b.id, "before": before, "after": after, "children": children,
            "n_recursive": len(recursive), "n_direct": len(direct), "missing_cancel": error}


async def queries(c: aioclient.BatchClient) -> dict[str, Any]:
    tag = str(time.time_ns())
    b = c.create_batch(attributes={"suite": tag})
    for i in range(60):
        b.create_job("ubuntu:24.04", ["true"], attributes={"name": f"job{i}", "parity": str(i % 2)})
    await b.submit(disable_progress_bar=True)
    g = b.get_job_group(0)
    out: dict[str, Any] = {"id": b.id}
    out["all"] = len(await jobs_of(g))
    out["v1_even"] = len(await jobs_of(g, q="parity=0"))
    out["v1_not_even"] = len(await jobs_of(g, q="!parity=0"))
    out["v2_name"] = [j["job_id"] for j in await jobs_of(g, q="name = job7", version=2)]
    out["v2_exact_word"] = [j["job_id"] for j in await jobs_of(g, q='"job7"', version=2)]
    out["v2_jobid"] = len(await jobs_of(g, q="job_id >= 51", version=2))
    out["v1_batches"] = [x.id async for x in c.list_batches(q=f"suite={tag}")]
    out["v2_batches"] = [x.id async for x in c.list_batches(q=f"suite = {tag}", version=2)]
    out["mine"] = len([x async for x in c.list_batches(limit=5)])
    errors = {}
    for q, v in (("state = bogus", 2), ("job_id >= x", 2), ("a b c d e =", 2)):
        try:
            await jobs_of(g, q=q, version=v)
            errors[q] = None
        except Exception as e:
            errors[q] = str(e)
    out["errors"] = errors
    return out


async def token_idempotent(c: aioclient.BatchClient) -> dict[str, Any]:
    token = f"tok-{time.time_ns()}"
    ids = []
    for _ in range(2):
        b = c.create_batch(token=token)
        b.create_job("ubuntu:24.04", ["true"])
        await b.submit(disable_progress_bar=True)
        ids.append(b.id)
    status = await (await c.get_batch(ids[0])).status()
    return {"ids": ids, "n_jobs": status["n_jobs"]}


async def errors(c: aioclient.BatchClient) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def attempt(name: str, coro: Any) -> None:
        try:
            await coro
            out[name] = None
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"

    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"], resources={"memory": "lots"})
    await attempt("bad_memory", b.submit(disable_progress_bar=True))
    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"], resources={"cpu": "7"})
    await attempt("bad_cpu", b.submit(disable_progress_bar=True))
    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"], timeout=-1)
    await attempt("bad_timeout", b.submit(disable_progress_bar=True))
    await attempt("missing_batch", c.get_batch(987654321))
    other = aioclient.BatchClient("no-such-project", url=c.url, session=c._session, headers={})
    b = other.create_batch()
    b.create_job("ubuntu:24.04", ["true"])
    await attempt("unknown_project", b.submit(disable_progress_bar=True))
    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)
    await b.cancel()
    b.create_job("ubuntu:24.04", ["true"])
    await attempt("cancelled_batch", b.submit(disable_progress_bar=True))
    bad = aioclient.BatchClient(c.billing_project, url=c.url, session=Session(
        credentials=aioclient.HailExplicitTokenCredentials("wrong")), headers={})
    await attempt("bad_token", bad.get_batch(1))
    await bad.close()
    return out


async def billing_member(c: aioclient.BatchClient) -> dict[str, Any]:
    out: dict[str, Any] = {"list": await c.list_billing_projects(),
                           "get": await c.get_billing_project(c.billing_project)}
    for name, coro in (("unknown", c.get_billing_project("nope")),
                       ("create", c.create_billing_project("mine"))):
        try:
            await coro
            out[name] = None
        except Exception as e:
            out[name] = str(e)
    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)
    out["attempts"] = await (await b.get_job(1)).attempts()
    out["log"] = await (await b.get_job(1)).log()
    return out


async def billing_developer(c: aioclient.BatchClient) -> dict[str, Any]:
    name = f"p{time.time_ns()}"
    out: dict[str, Any] = {"create": await c.create_billing_project(name)}
    out["add"] = await c.add_user("tester", name)
    out["limit"] = await c.edit_billing_limit(name, 12.5)
    out["after"] = await c.get_billing_project(name)
    try:
        await c.delete_billing_project(name)
        out["delete_open"] = None
    except Exception as e:
        out["delete_open"] = str(e)
    out["close"] = await c.close_billing_project(name)
    out["closed"] = (await c.get_billing_project(name))["status"]
    out["reopen"] = await c.reopen_billing_project(name)
    out["remove"] = await c.remove_user("tester", name)
    await c.close_billing_project(name)
    out["delete"] = await c.delete_billing_project(name)
    out["listed_after_delete"] = name in [p["billing_project"]
                                          for p in await c.list_billing_projects()]
    return out


SCENARIOS = {f.__name__: f for f in (create_fast_dependency, big_batch, updates, groups, queries,
                                     token_idempotent, errors, billing_member,
                                     billing_developer)}


async def main() -> None:
    name, url, token, project, *args = sys.argv[1:]
    c = await client(url, token, project)
    try:
        result = await SCENARIOS[name](c, *args)
    finally:
        await c.close()
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    asyncio.run(main())
