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


async def empty_batch(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch(attributes={"name": "empty"})
    await b.submit(disable_progress_bar=True)  # POST /batches/create, no update
    first = await asyncio.wait_for(b.wait(disable_progress_bar=True), 60)
    b.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)  # update-fast reopens it
    return {"id": b.id, "first": first, "after_update": await b.status()}


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


# --- execution: jobs run on workers the scheduler starts --------------------------------------

async def wait_until(check: Any, within_s: float = 120.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


def summary(status: dict[str, Any]) -> dict[str, Any]:
    main = ((status.get("status") or {}).get("container_statuses") or {}).get("main") or {}
    return {"state": status["state"], "exit_code": status.get("exit_code"),
            "error": (main.get("error") or (status.get("status") or {}).get("error")),
            "main_state": main.get("state"), "timing": sorted(main.get("timing") or {}),
            "container_exit_code": (main.get("container_status") or {}).get("exit_code"),
            "document": {k: (status.get("status") or {}).get(k) for k in (
                "state", "batch_id", "job_id", "user", "worker", "start_time")}}


async def run_basic(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch(attributes={"name": "basic"})
    ok = b.create_job("ubuntu:24.04", ["true"])
    bad = b.create_job("ubuntu:24.04", ["false"])
    echo = b.create_job("ubuntu:24.04", ["bash", "-c", "echo hello; echo $GREETING >&2"],
                        env={"GREETING": "bonjour"})
    missing = b.create_job("ubuntu:24.04", ["/no/such/executable-hs"])
    timeout = b.create_job("ubuntu:24.04", ["sleep", "30"], timeout=1)
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    out: dict[str, Any] = {"batch": status}
    for name, job in (("ok", ok), ("bad", bad), ("echo", echo), ("missing", missing),
                      ("timeout", timeout)):
        out[name] = summary(await job.status())
    out["log"] = await echo.log()
    out["container_log"] = (await echo.container_log("main")).decode()
    out["silent_log"] = await ok.log()  # wrote nothing: the worker made no file for it
    out["silent_container_log"] = (await ok.container_log("main")).decode()
    out["attempts"] = await echo.attempts()
    out["listed"] = states(await jobs_of(b.get_job_group(0)))
    return out


async def dag(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    root = b.create_job("ubuntu:24.04", ["false"])
    child = b.create_job("ubuntu:24.04", ["true"], parents=[root])
    cleanup = b.create_job("ubuntu:24.04", ["true"], parents=[root], always_run=True)
    ok = b.create_job("ubuntu:24.04", ["true"])
    after_ok = b.create_job("ubuntu:24.04", ["echo", "after"], parents=[ok])
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    return {"batch": status, "states": {name: (await j.status())["state"] for name, j in (
        ("root", root), ("child", child), ("cleanup", cleanup), ("ok", ok),
        ("after_ok", after_ok))}}


async def cancel(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    running = b.create_job("ubuntu:24.04", ["sleep", "300"])
    for _ in range(20):
        b.create_job("ubuntu:24.04", ["sleep", "300"], parents=[running])
    last = b.create_job("ubuntu:24.04", ["true"], parents=[running], always_run=True)
    await b.submit(disable_progress_bar=True)

    async def started() -> bool:
        return (await running.status())["state"] == "Running"

    was_running = await wait_until(started)
    t0 = time.monotonic()
    await b.cancel()
    status = await b.wait(disable_progress_bar=True)
    return {"was_running": was_running, "seconds": time.monotonic() - t0, "batch": status,
            "running": summary(await running.status()),
            "last": (await last.status())["state"],
            "states": sorted(set(states(await jobs_of(b.get_job_group(0))).values()))}


async def n_failures(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch(cancel_after_n_failures=1)
    blocker = b.create_job("ubuntu:24.04", ["sleep", "300"])
    b.create_job("ubuntu:24.04", ["false"])
    g = b.create_job_group(cancel_after_n_failures=2)
    g.create_job("ubuntu:24.04", ["true"])
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    b2 = c.create_batch()
    group = b2.create_job_group(cancel_after_n_failures=1)
    group.create_job("ubuntu:24.04", ["false"])
    slow = group.create_job("ubuntu:24.04", ["sleep", "300"])
    outside = b2.create_job("ubuntu:24.04", ["true"])
    await b2.submit(disable_progress_bar=True)

    async def group_done() -> Any:
        s = await group.status()
        return s if s["complete"] else None

    group_status = await wait_until(group_done)
    status2 = await b2.wait(disable_progress_bar=True)
    return {"batch": status, "blocker": (await blocker.status())["state"],
            "group": group_status, "slow": (await slow.status())["state"],
            "outside": (await outside.status())["state"], "batch2": status2}


async def job_groups_run(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    outer = b.create_job_group(attributes={"name": "outer"})
    inner = outer.create_job_group(attributes={"name": "inner"})
    outer.create_job("ubuntu:24.04", ["true"])
    inner.create_job("ubuntu:24.04", ["true"])
    inner.create_job("ubuntu:24.04", ["false"])
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    return {"batch": status, "outer": await outer.status(), "inner": await inner.status()}


async def machine_types(c: aioclient.BatchClient) -> dict[str, Any]:
    b = c.create_batch()
    private = b.create_job("ubuntu:24.04", ["bash", "-c", "echo $HAIL_JOB_ID"],
                           resources={"machine_type": "n1-standard-2"})
    big = b.create_job("ubuntu:24.04", ["true"], resources={"cpu": "8"})
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    return {"batch": status, "private": await private.status(), "big": await big.status(),
            "private_log": await private.log()}


async def many_noops(c: aioclient.BatchClient, n: str) -> dict[str, Any]:
    b = c.create_batch()
    for _ in range(int(n)):
        b.create_job("ubuntu:24.04", ["true"], resources={"cpu": "0.25"})
    t0 = time.perf_counter()
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    return {"id": b.id, "batch": status, "seconds": time.perf_counter() - t0}


async def submit_sleepers(c: aioclient.BatchClient, n: str, seconds: str) -> dict[str, Any]:
    b = c.create_batch()
    for _ in range(int(n)):
        b.create_job("ubuntu:24.04", ["sleep", seconds], resources={"cpu": "0.25"})
    await b.submit(disable_progress_bar=True)
    return {"id": b.id}


async def wait_batch(c: aioclient.BatchClient, batch_id: str) -> dict[str, Any]:
    b = await c.get_batch(int(batch_id))
    status = await b.wait(disable_progress_bar=True)
    jobs = await jobs_of(b.get_job_group(0))
    attempts = {j["job_id"]: await (await b.get_job(j["job_id"])).attempts() for j in jobs}
    return {"batch": status, "states": states(jobs), "attempts": attempts}


async def submit_refused(c: aioclient.BatchClient) -> dict[str, Any]:
    """Try to submit one job; the HTTP status and message of the refusal (or the batch id)."""
    b = c.create_batch()
    b.create_job("ubuntu:24.04", ["true"], resources={"cpu": "0.25"})
    try:
        await b.submit(disable_progress_bar=True)
    except Exception as e:  # the client raises its own ClientResponseError
        return {"status": getattr(e, "status", None), "message": str(e)}
    return {"id": b.id}


async def billed_batch(c: aioclient.BatchClient) -> dict[str, Any]:
    """Two sleepers run to completion; the batch, its jobs (listed) and each job's status."""
    b = c.create_batch()
    for seconds in ("3", "4"):
        b.create_job("ubuntu:24.04", ["sleep", seconds], resources={"cpu": "0.25"})
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    listed = await jobs_of(b.get_job_group(0))
    jobs = {j["job_id"]: await (await b.get_job(j["job_id"])).status() for j in listed}
    return {"batch": status, "listed": listed, "jobs": jobs}


async def callbacks(c: aioclient.BatchClient, batch_url: str, group_url: str) -> dict[str, Any]:
    b = c.create_batch(attributes={"name": "called-back"}, callback=batch_url)
    g = b.create_job_group(attributes={"name": "grouped"}, callback=group_url)
    g.create_job("ubuntu:24.04", ["true"])
    b.create_job("ubuntu:24.04", ["false"])
    await b.submit(disable_progress_bar=True)
    status = await b.wait(disable_progress_bar=True)
    return {"id": b.id, "batch": status, "group": await g.status(),
            "group_id": g.job_group_id}


SCENARIOS = {f.__name__: f for f in (
    create_fast_dependency, big_batch, empty_batch, updates, groups, queries, token_idempotent,
    errors, billing_member, billing_developer, run_basic, dag, cancel, n_failures, job_groups_run,
    machine_types, many_noops, submit_sleepers, wait_batch, callbacks, submit_refused,
    billed_batch)}


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
