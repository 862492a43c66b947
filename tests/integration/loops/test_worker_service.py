"""The worker service against the real broker and real processes: dispatch, reports, cancel."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from schemas.base import Event
from schemas.events import AnyEvent
from schemas.execution import AttemptHeartbeat, JobCompleted, JobsCompleted, JobStarted
from schemas.infra import InstanceActivated
from services.common import metrics, procs
from services.common.log import (
    ConsumerOptions,
    LogConsumer,
    LogError,
    LogPosition,
    Publisher,
    bootstrap_topics,
)
from services.common.settings import TOPIC_BATCH, TOPIC_SCHEDULER, LogSettings
from services.common.specstore import LocalSpecStore
from services.scheduler.dispatch import Attempt, Delivery, WorkerClient
from services.worker import service
from services.worker.__main__ import load_worker_settings
from services.worker.logstore import LocalLogStore
from services.worker.outbox import Outbox
from services.worker.runtime import FileLogSink, time_ms
from services.worker.service import _START_SWEEP_S, Worker, WorkerSettings
from services.worker.status import compact_status

pytestmark = pytest.mark.integration

BATCH = 7


def spec(*command: str) -> dict[str, Any]:
    return {"process": {"type": "docker", "image": "ubuntu:24.04", "command": list(command)}}


def sleeper(pidfile: Path) -> dict[str, Any]:
    """A job that appends its pid to ``pidfile`` (one line per run), then sleeps."""
    return spec("sh", "-c", f"echo $$ >> {pidfile}; exec sleep 30")


class Env:
    """A running worker, an HTTP client to it and a reader of the log."""

    def __init__(self, worker: Worker, http: aiohttp.ClientSession, consumer: LogConsumer,
                 log_settings: LogSettings) -> None:
        self.worker = worker
        self.http = http
        self.consumer = consumer
        self.log_settings = log_settings
        self.events: list[Event] = []
        self.records: list[Event] = []  # as on the log: bunches not expanded
        self.base = f"http://{worker.address}"

    async def post(self, job_id: int, attempt_id: str, job_spec: dict[str, Any] | None,
                   cores_mcpu: int = 1000) -> tuple[int, dict[str, Any]]:
        """Dispatch an attempt; without ``job_spec`` the worker reads it from its spec store."""
        body: dict[str, Any] = {"batch_id": BATCH, "job_id": job_id, "attempt_id": attempt_id,
                                "user": "alice", "cores_mcpu": cores_mcpu}
        if job_spec is not None:
            body["spec"] = job_spec
        async with self.http.post(f"{self.base}/api/v1alpha/jobs", json=body) as r:
            return r.status, await r.json()

    async def delete(self, job_id: int, attempt_id: str) -> int:
        async with self.http.delete(
                f"{self.base}/api/v1alpha/jobs/{BATCH}/{job_id}/{attempt_id}") as r:
            return r.status

    async def free_mcpu(self) -> int:
        async with self.http.get(f"{self.base}/healthcheck") as r:
            assert r.status == 200
            return int((await r.json())["free_mcpu"])

    async def log(self, job_id: int, attempt_id: str, container: str = "main"
                  ) -> tuple[int, bytes]:
        url = f"{self.base}/api/v1alpha/jobs/{BATCH}/{job_id}/{attempt_id}/log/{container}"
        async with self.http.get(url) as r:
            return r.status, await r.read()

    async def wait_for(self, found: Callable[[list[Event]], bool], timeout_s: float = 30
                       ) -> list[Event]:
        async with asyncio.timeout(timeout_s):
            while not found(self.events):
                for r in await self.consumer.next_batch():
                    self.records.append(r.envelope.event)
                    event = r.envelope.event  # a bunch of MJCs as its single MJCs
                    self.events += event.expand() if isinstance(event, JobsCompleted) else [
                        event]
        return self.events

    async def settle(self) -> list[Event]:
        """Everything published for the batch so far: read up to a marker published now."""
        marker = AttemptHeartbeat(batch_id=BATCH, job_id=0, attempt_id="marker",
                                  instance_name="test", rollup_time_ms=0)
        async with Publisher(self.log_settings) as pub:
            await pub.publish(marker)
        return await self.wait_for(lambda evs: marker in evs)

    def of(self, kind: type[Event], job_id: int | None = None) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)
                and (job_id is None or getattr(e, "job_id", None) == job_id)]


@asynccontextmanager
async def running(log_settings: LogSettings, tmp_path: Path, *,
                  publisher: Publisher | None = None, clock: Callable[[], int] = time_ms,
                  store: LocalLogStore | None = None, specs: LocalSpecStore | None = None,
                  **overrides: Any) -> AsyncIterator[Env]:
    # One partition per topic: the reader seeks each partition in turn, about 0.5 s apiece.
    log_settings = msgspec.structs.replace(log_settings, partitions=1)
    await bootstrap_topics(log_settings)
    settings = WorkerSettings(**{
        "instance_name": "worker-1", "port": procs.free_port(), "cores_mcpu": 4000,
        "log_dir": str(tmp_path / "logs"), "scratch_dir": str(tmp_path / "scratch"),
        "spec_dir": str(tmp_path / "specs"),
        "report_retry_s": 0.05, "start_report_ms": 0, **overrides})
    options = ConsumerOptions(name="reader", topics=[TOPIC_BATCH, TOPIC_SCHEDULER], group=False)
    async with LogConsumer(log_settings, options) as consumer, aiohttp.ClientSession() as http:
        worker = Worker(settings, log_settings, publisher=publisher, clock=clock, store=store,
                        specs=specs)
        async with worker:
            yield Env(worker, http, consumer, log_settings)


def completed(job_id: int) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, JobCompleted) and e.job_id == job_id for e in evs)


def started(job_id: int) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, JobStarted) and e.job_id == job_id for e in evs)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def pids_in(path: Path, n: int = 1) -> list[int]:
    for _ in range(500):
        if len(pids := read_pids(path)) >= n:
            return pids
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never listed {n} pids")


def _named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


async def test_attempts_report_start_then_completion(log_settings: LogSettings,
                                                     tmp_path: Path) -> None:
    jobs = {1: (spec("true"), "Success", 0), 2: (spec("false"), "Failed", 1),
            3: (spec("echo", "hello"), "Success", 0),
            4: ({**spec("true"), "input_files": [["gs://b/x", "/io/x"]]}, "Error", None)}
    async with running(log_settings, tmp_path) as env:
        for job_id, (job_spec, _, _) in jobs.items():
            assert await env.post(job_id, "a1", job_spec) == (200, {"attempt": "started"})
        await env.wait_for(lambda evs: all(completed(j)(evs) for j in jobs))
        assert await env.log(3, "a1") == (200, b"hello\n")
        assert (await env.log(3, "a1", "output"))[0] == 404
        assert (await env.log(3, "nope"))[0] == 404
        # A job that wrote nothing has no file (made on the first byte) and an empty log.
        assert await env.log(1, "a1") == (200, b"")
        assert _named(tmp_path, "3+a1+main.log") and not _named(tmp_path, "1+a1+main.log")
        assert (await env.log(1, "a1", "output"))[0] == 404
        async with env.http.get(f"{env.base}/healthcheck") as r:
            assert r.status == 200
            assert (await r.json())["free_mcpu"] == 4000

    (activated,) = env.of(InstanceActivated)
    assert activated == InstanceActivated(instance_name="worker-1", address=env.worker.address,
                                          cores_mcpu=4000)
    for job_id, (_, state, exit_code) in jobs.items():
        kinds = [type(e) for e in env.events if getattr(e, "job_id", None) == job_id]
        assert kinds == [JobStarted, JobCompleted]
        (mjc,) = env.of(JobCompleted, job_id)
        assert (mjc.state, mjc.exit_code, mjc.attempt_id) == (state, exit_code, "a1")
        assert mjc.instance_name == "worker-1"
        if exit_code is not None:  # ran to an exit, main alone: the MJC carries no document
            assert mjc.status is None and mjc.exit_code is not None
            assert mjc.start_time_ms is not None and mjc.main_start_ms is not None
            assert mjc.main_end_ms is not None
            assert mjc.start_time_ms <= mjc.main_start_ms <= mjc.main_end_ms <= mjc.end_time_ms
            doc = compact_status(
                batch_id=mjc.batch_id, job_id=job_id, attempt_id="a1", user="alice",
                worker=mjc.instance_name, region=mjc.region, state=mjc.state,
                exit_code=mjc.exit_code, start_time_ms=mjc.start_time_ms,
                end_time_ms=mjc.end_time_ms, main_start_ms=mjc.main_start_ms,
                main_end_ms=mjc.main_end_ms, resources=mjc.resources)
        else:
            doc = msgspec.json.decode(mjc.status)
        main = doc["container_statuses"]["main"]
        assert main.get("container_status", {}).get("exit_code") == exit_code
    assert "not supported" in (env.of(JobCompleted, 4)[0].error or "")


async def test_a_repeated_delivery_runs_the_attempt_once(log_settings: LogSettings,
                                                         tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job_spec = spec("sh", "-c", f"echo $$ >> {pidfile}")
    async with running(log_settings, tmp_path) as env:
        answers = await asyncio.gather(*(env.post(1, "a1", job_spec) for _ in range(3)))
        assert sorted(a["attempt"] for _, a in answers) == ["running", "running", "started"]
        await env.wait_for(completed(1))
        assert await env.post(1, "a1", job_spec) == (200, {"attempt": "finished"})
        assert await env.delete(1, "a1") == 200  # cancelling a finished attempt: a no-op
        await env.settle()
    assert len(await pids_in(pidfile)) == 1
    assert len(env.of(JobStarted, 1)) == len(env.of(JobCompleted, 1)) == 1


async def test_delete_cancels_a_running_attempt(log_settings: LogSettings,
                                                tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    async with running(log_settings, tmp_path) as env:
        assert (await env.post(1, "a1", sleeper(pidfile)))[0] == 200
        (pid,) = await pids_in(pidfile)
        await env.wait_for(started(1))
        assert await env.delete(1, "a1") == 200
        assert await env.delete(1, "nope") == 404
        await env.wait_for(completed(1), timeout_s=5)
        assert not alive(pid)
        await env.settle()
    (mjc,) = env.of(JobCompleted, 1)
    assert (mjc.state, mjc.exit_code) == ("Cancelled", None)
    assert msgspec.json.decode(mjc.status)["state"] == "cancelled"


async def test_refuses_jobs_beyond_its_free_cores(log_settings: LogSettings,
                                                  tmp_path: Path) -> None:
    async with running(log_settings, tmp_path, cores_mcpu=1000) as env:
        assert (await env.post(1, "a1", sleeper(tmp_path / "p1"), cores_mcpu=750))[0] == 200
        status, body = await env.post(2, "a1", sleeper(tmp_path / "p2"), cores_mcpu=500)
        assert status == 409
        assert "250 of 1000 mCPU are free" in body["message"]
        assert (await env.post(3, "a1", sleeper(tmp_path / "p3"), cores_mcpu=250))[0] == 200
        assert (await env.post(4, "a1", {"process": {"type": "jvm"}}))[0] == 400
        assert (await env.post(4, "../x", spec("true")))[0] == 400
        async with env.http.post(f"{env.base}/api/v1alpha/jobs", json={"batch_id": 1}) as r:
            assert r.status == 400
        assert await env.delete(1, "a1") == 200
        await env.wait_for(completed(1))
        # The cancelled attempt's cores are free again.
        assert (await env.post(2, "a1", sleeper(tmp_path / "p2"), cores_mcpu=500))[0] == 200


async def test_a_batch_delivery_answers_each_attempt(log_settings: LogSettings,
                                                     tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    job = spec("sh", "-c", f"echo $$ >> {pidfile}")

    def body(job_id: int, attempt_id: str = "a1", cores: int = 1000,
             job_spec: dict[str, Any] | None = job) -> dict[str, Any]:
        return {"batch_id": BATCH, "job_id": job_id, "attempt_id": attempt_id, "user": "alice",
                "cores_mcpu": cores, "spec": job_spec}

    async with running(log_settings, tmp_path, cores_mcpu=2500) as env:
        url = f"{env.base}/api/v1alpha/attempts"
        async with env.http.post(url, json=[
                body(1), body(2), body(1), body(3, cores=1000), body(4, "../x"),
                body(5, job_spec={"process": {"type": "jvm"}}), body(6, cores=500)]) as r:
            assert r.status == 200
            answers = await r.json()
        assert [(a["status"], a.get("attempt")) for a in answers] == [
            (200, "started"), (200, "started"), (200, "running"), (409, None), (400, None),
            (400, None), (200, "started")]
        assert "500 of 2500 mCPU are free" in answers[3]["message"]
        await env.wait_for(lambda evs: all(completed(j)(evs) for j in (1, 2, 6)))
        async with env.http.post(url, json=[body(1)]) as r:
            assert [a["attempt"] for a in await r.json()] == ["finished"]
        async with env.http.post(url, json={"batch_id": 1}) as r:
            assert r.status == 400
        await env.settle()
    assert len(await pids_in(pidfile)) == 3
    assert sorted(e.job_id for e in env.of(JobCompleted)) == [1, 2, 6]


async def test_the_scheduler_delivers_many_attempts_in_one_request(log_settings: LogSettings,
                                                                   tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    LocalSpecStore(tmp_path / "specs").write_bunch(BATCH, [
        (j, msgspec.json.encode(spec("sh", "-c", f"echo $$ >> {pidfile}")).decode())
        for j in range(1, 4)])
    async with running(log_settings, tmp_path, cores_mcpu=2000) as env:
        async with WorkerClient(timeout_s=5, concurrency=10) as client:
            results = await client.deliver_many(env.worker.address, [
                Attempt(batch_id=BATCH, job_id=j, attempt_id="a1", user="alice",
                        cores_mcpu=1000) for j in (1, 2, 3)])
            assert results == [Delivery.ACCEPTED, Delivery.ACCEPTED, Delivery.REFUSED]
            await env.wait_for(lambda evs: completed(1)(evs) and completed(2)(evs))
            again = await client.deliver_many(env.worker.address, [
                Attempt(batch_id=BATCH, job_id=j, attempt_id="a1", user="alice",
                        cores_mcpu=1000) for j in (1, 2)])
            assert again == [Delivery.ACCEPTED, Delivery.ACCEPTED]  # idempotent: finished
            # Nobody listening: the worker may or may not have them.
            gone = f"127.0.0.1:{procs.free_port()}"
            assert await client.deliver_many(gone, [
                Attempt(batch_id=BATCH, job_id=j, attempt_id="a2", user="alice",
                        cores_mcpu=1) for j in (1, 2)]) == [Delivery.UNKNOWN] * 2
        await env.settle()
    assert len(await pids_in(pidfile)) == 2


async def test_heartbeats_carry_the_clock_for_running_attempts(log_settings: LogSettings,
                                                               tmp_path: Path) -> None:
    ticks = itertools.count(5_000_000)
    async with running(log_settings, tmp_path, heartbeat_s=0.2,
                       clock=lambda: next(ticks)) as env:
        await env.post(1, "a1", sleeper(tmp_path / "pids"))
        await env.wait_for(lambda evs: len(env.of(AttemptHeartbeat, 1)) >= 3)
        await env.delete(1, "a1")
        await env.wait_for(completed(1))
        await asyncio.sleep(0.5)
        await env.settle()
    beats = env.of(AttemptHeartbeat, 1)
    rollups = [b.rollup_time_ms for b in beats]
    assert rollups == sorted(rollups) and rollups[0] >= 5_000_000
    assert {b.attempt_id for b in beats} == {"a1"}
    # None after the MJC.
    assert env.events.index(env.of(JobCompleted, 1)[0]) > env.events.index(beats[-1])


async def test_shutdown_kills_attempts_without_reporting_them(log_settings: LogSettings,
                                                              tmp_path: Path) -> None:
    async with running(log_settings, tmp_path) as env:
        for job_id in (1, 2):
            await env.post(job_id, "a1", sleeper(tmp_path / f"pids{job_id}"))
        pids = [(await pids_in(tmp_path / f"pids{job_id}"))[0] for job_id in (1, 2)]
        await env.wait_for(lambda evs: started(1)(evs) and started(2)(evs))
        await env.worker.stop()
        await env.worker.stop()  # idempotent
        assert not any(alive(pid) for pid in pids)
        with pytest.raises(aiohttp.ClientConnectionError):
            await env.post(3, "a1", spec("true"))
        await env.settle()
    assert env.of(JobCompleted) == []
    assert not list((tmp_path / "scratch").rglob("*"))  # working directories removed


async def test_an_emptied_working_directory_is_reused_and_a_littered_one_never_is(
        log_settings: LogSettings, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    jobs = {1: "pwd > {out}/cwd1; touch left-behind",
            2: "pwd > {out}/cwd2; ls -A > {out}/ls2",
            3: "pwd > {out}/cwd3"}
    async with running(log_settings, tmp_path) as env:
        for job_id, script in jobs.items():  # one after the other
            await env.post(job_id, "a1", spec("sh", "-c", script.format(out=out)))
            await env.wait_for(completed(job_id))
        cwd = {j: (out / f"cwd{j}").read_text().strip() for j in jobs}
        exists = {j: await asyncio.to_thread(os.path.isdir, cwd[j]) for j in jobs}
    assert (out / "ls2").read_text() == ""  # job 1's file did not follow it
    assert cwd[2] != cwd[1] and not exists[1]  # littered: removed
    assert cwd[3] == cwd[2] and exists[3]  # left empty: kept for the next attempt


@pytest.mark.parametrize("fresh_s", [0.0, 3600.0])
async def test_a_reused_working_directory_removed_meanwhile_is_made_again_once_stale(
        log_settings: LogSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        fresh_s: float) -> None:
    """A directory freed moments ago is reused as it is; one freed longer ago is made again
    first, in case something (a temporary-files cleaner) removed it meanwhile."""
    monkeypatch.setattr(service, "FRESH_WORKDIR_S", fresh_s)
    out = tmp_path / "out"
    out.mkdir()
    async with running(log_settings, tmp_path) as env:
        await env.post(1, "a1", spec("sh", "-c", f"pwd > {out}/cwd1"))
        await env.wait_for(completed(1))
        cwd1 = (out / "cwd1").read_text().strip()
        if fresh_s == 0.0:
            os.rmdir(cwd1)  # behind the worker's back
        await env.post(2, "a1", spec("sh", "-c", f"pwd > {out}/cwd2"))
        await env.wait_for(completed(2))
        states = [e.state for e in env.of(JobCompleted, 2)]
    assert states == ["Success"]
    assert (out / "cwd2").read_text().strip() == cwd1  # the same directory, there again


async def test_an_attempt_that_ends_before_its_start_is_due_reports_only_its_completion(
        log_settings: LogSettings, tmp_path: Path) -> None:
    ticks = itertools.count(7_000_000)
    async with running(log_settings, tmp_path, start_report_ms=5_000,
                       clock=lambda: next(ticks)) as env:
        before = _sample("hs_worker_mjs_coalesced_total")
        await env.post(1, "a1", spec("true"))
        await env.wait_for(completed(1))
        await env.settle()
        assert _sample("hs_worker_mjs_coalesced_total") == before + 1
    assert env.of(JobStarted, 1) == []
    (mjc,) = env.of(JobCompleted, 1)
    # The MJC carries what the MJS would have: the attempt's start (the worker's first tick).
    assert mjc.state == "Success" and mjc.start_time_ms == 7_000_000 <= mjc.end_time_ms


async def test_completions_gathered_in_the_outbox_go_out_as_one_record_per_batch(
        log_settings: LogSettings, tmp_path: Path) -> None:
    async with running(log_settings, tmp_path, start_report_ms=5_000, linger_ms=400) as env:
        def mjcs() -> float:
            return sum(_sample("hs_worker_mjc_published_total", state=state)
                       for state in ("Success", "Failed"))

        before = mjcs()
        for job_id in (1, 2, 3):
            await env.post(job_id, "a1", spec("true"))
        await env.post(4, "a1", spec("false"))
        await env.wait_for(lambda evs: all(completed(j)(evs) for j in (1, 2, 3, 4)))
        await env.settle()
        published = mjcs() - before
    assert published == 4  # the metric counts completions, not records
    bunches = [e for e in env.records if isinstance(e, JobsCompleted)]
    assert [e for e in env.records if isinstance(e, JobCompleted)] == []
    assert sorted(a.job_id for b in bunches for a in b.attempts) == [1, 2, 3, 4]
    assert len(bunches) < 4 and all(b.instance_name == "worker-1" for b in bunches)
    states = {m.job_id: (m.state, m.exit_code, m.start_reported) for m in env.of(JobCompleted)}
    assert states == {1: ("Success", 0, False), 2: ("Success", 0, False),
                      3: ("Success", 0, False), 4: ("Failed", 1, False)}


async def test_a_longer_attempt_reports_its_start_while_it_runs_and_heartbeats_after_it(
        log_settings: LogSettings, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    async with running(log_settings, tmp_path, start_report_ms=300, heartbeat_s=0.05) as env:
        await env.post(1, "a1", sleeper(pidfile))
        (pid,) = await pids_in(pidfile)
        await env.wait_for(started(1))
        assert alive(pid)  # published while the job runs, not at its end
        await env.wait_for(lambda evs: len(env.of(AttemptHeartbeat, 1)) >= 2)
        await env.delete(1, "a1")
        await env.wait_for(completed(1))
        await env.settle()
    (mjs,) = env.of(JobStarted, 1)
    (mjc,) = env.of(JobCompleted, 1)
    assert mjs.start_time_ms == mjc.start_time_ms
    # The log keeps the attempt's order: its start, its heartbeats, its completion.
    mine = [e for e in env.events if getattr(e, "job_id", None) == 1]
    assert mine[0] == mjs and mine[-1] == mjc
    assert all(isinstance(e, AttemptHeartbeat) for e in mine[1:-1]) and len(mine) >= 4


async def test_attempts_started_apart_each_report_their_start_after_their_own_delay(
        log_settings: LogSettings, tmp_path: Path) -> None:
    # One sweep serves every attempt's MJS: each goes out once its own attempt has run the
    # delay, whatever the others do; one that ends first reports none; stopping the worker
    # with MJS still due publishes nothing more and leaves no timer behind.
    pidfile = tmp_path / "pids"
    delay_s = 0.4
    async with running(log_settings, tmp_path, start_report_ms=int(delay_s * 1000)) as env:
        loop = asyncio.get_running_loop()
        posted = {}
        for job_id in (1, 2):
            await env.post(job_id, "a1", sleeper(pidfile))
            posted[job_id] = loop.time()
            await asyncio.sleep(0.25)
        await env.post(3, "a1", spec("true"))
        await env.wait_for(completed(3))
        await env.wait_for(started(1))
        assert loop.time() - posted[1] >= delay_s - _START_SWEEP_S  # not before its own delay
        # The sweep comes back when job 2 is due, not later: an MJS is never late.
        assert env.worker._start_sweep is not None
        # (uvloop keeps timers to the millisecond)
        assert env.worker._start_sweep.when() == pytest.approx(env.worker._starts_due[0][0],
                                                               abs=0.002)
        await env.wait_for(started(2))
        assert loop.time() - posted[2] >= delay_s - _START_SWEEP_S
        await env.post(4, "a1", sleeper(pidfile))  # its MJS still due when the worker stops
        await pids_in(pidfile, 3)
        await env.worker.stop()  # idempotent: leaving the block stops it again
        assert env.worker._start_sweep is None
        await asyncio.sleep(delay_s)  # past job 4's due time
        await env.settle()
    assert len(env.of(JobStarted, 1)) == len(env.of(JobStarted, 2)) == 1
    assert env.of(JobStarted, 3) == [] and env.of(JobStarted, 4) == []
    (mjc,) = env.of(JobCompleted, 3)
    assert mjc.start_reported is False


async def test_an_attempt_that_runs_just_its_delay_reports_its_start(
        log_settings: LogSettings, tmp_path: Path) -> None:
    # Job 2 is due 20 ms after job 1, and its timeout equals the delay. The sweep at job 1's
    # due time takes job 2's MJS too (early, never late), so it goes out before the timeout,
    # which starts later than the attempt, ends the job. A sweep that came back 50 ms later
    # found job 2 ended, and its start was never reported.
    pidfile = tmp_path / "pids"
    delay_ms = 300
    async with running(log_settings, tmp_path, start_report_ms=delay_ms) as env:
        await env.post(1, "a1", sleeper(pidfile))
        await asyncio.sleep(0.02)
        await env.post(2, "a1", {**spec("sleep", "30"), "timeout": delay_ms / 1000})
        await env.wait_for(completed(2))
        await env.delete(1, "a1")
        await env.wait_for(completed(1))
        await env.settle()
    (mjc,) = env.of(JobCompleted, 2)
    assert mjc.state == "Error" and mjc.start_reported is True
    (mjs,) = env.of(JobStarted, 2)
    assert env.events.index(mjs) < env.events.index(mjc)


def _sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or None) or 0.0


class FlakyPublisher(Publisher):
    """Fails the first ``failures`` MJC publishes as a broker hiccup would."""

    def __init__(self, settings: LogSettings, failures: int) -> None:
        super().__init__(settings)
        self.failures = failures

    async def publish_many(self, events: Sequence[AnyEvent | Any], *,
                           partition: int | None = None) -> list[LogPosition]:
        if self.failures and any(isinstance(e, JobCompleted | JobsCompleted) for e in events):
            self.failures -= 1
            raise LogError("publishing: KafkaTimeoutError", retryable=True)
        return await super().publish_many(events, partition=partition)


async def test_an_mjc_survives_broker_hiccups(log_settings: LogSettings,
                                              tmp_path: Path) -> None:
    flaky = FlakyPublisher(log_settings, failures=3)
    async with running(log_settings, tmp_path, publisher=flaky) as env:
        await env.post(1, "a1", spec("true"))
        await env.wait_for(completed(1))
        await env.settle()
    assert flaky.failures == 0
    (mjc,) = env.of(JobCompleted, 1)
    assert mjc.state == "Success"


class PoisonPublisher(Publisher):
    """Cannot publish (as if it could not encode) any record with job 2's completion."""

    async def publish_many(self, events: Sequence[AnyEvent | Any], *,
                           partition: int | None = None) -> list[LogPosition]:
        for e in events:
            jobs = [a.job_id for a in e.attempts] if isinstance(e, JobsCompleted) else [
                getattr(e, "job_id", None)] if isinstance(e, JobCompleted) else []
            if 2 in jobs:
                raise TypeError("cannot encode job 2's completion")
        return await super().publish_many(events, partition=partition)


async def test_an_event_that_cannot_be_published_fails_alone(log_settings: LogSettings,
                                                             tmp_path: Path) -> None:
    poison = PoisonPublisher(log_settings)
    async with running(log_settings, tmp_path, publisher=poison, linger_ms=300) as env:
        for job_id in (1, 2, 3):
            await env.post(job_id, "a1", spec("true"))
        await env.wait_for(lambda evs: completed(1)(evs) and completed(3)(evs))
        await env.settle()
        async with env.http.get(f"{env.base}/healthcheck") as r:
            assert r.status == 200 and (await r.json())["free_mcpu"] == 4000
    assert sorted(m.job_id for m in env.of(JobCompleted)) == [1, 3]


def test_settings_from_the_environment() -> None:
    settings = load_worker_settings({"HS_WORKER_INSTANCE_NAME": "w-9", "HS_WORKER_PORT": "6001",
                                     "HS_WORKER_CORES_MCPU": "16000",
                                     "HS_WORKER_HEARTBEAT_S": "0.5",
                                     "HS_WORKER_START_REPORT_MS": "40"}, data_dir="/data")
    assert settings.start_report_ms == 40
    assert load_worker_settings({}).start_report_ms == 1_000
    assert (settings.instance_name, settings.port, settings.cores_mcpu) == ("w-9", 6001, 16000)
    # Logs and specs default to the shared roots ingest uses.
    assert (settings.heartbeat_s, settings.log_dir, settings.spec_dir) == (
        0.5, "/data/job-logs", "/data/specs")
    shared = load_worker_settings({"HS_LOG_DIR": "/l", "HS_SPEC_DIR": "/s"}, data_dir="/data")
    assert (shared.log_dir, shared.spec_dir) == ("/l", "/s")
    own = load_worker_settings({"HS_LOG_DIR": "/l", "HS_WORKER_LOG_DIR": "/wl",
                                "HS_WORKER_SPEC_DIR": "/ws"}, data_dir="/data")
    assert (own.log_dir, own.spec_dir) == ("/wl", "/ws")
    with pytest.raises(ValueError, match="HS_WORKER_PORT"):
        load_worker_settings({"HS_WORKER_PORT": "x"})


async def test_a_dispatch_without_a_spec_reads_it_from_the_spec_store(
        log_settings: LogSettings, tmp_path: Path) -> None:
    LocalSpecStore(tmp_path / "specs").write_bunch(BATCH, [
        (1, msgspec.json.encode(spec("echo", "from the store")).decode()),
        (2, msgspec.json.encode(spec("false")).decode()),
        (3, '{"process": {"type": "jvm"}}'),
    ])
    async with running(log_settings, tmp_path) as env:
        for job_id in (1, 2, 3, 4):
            assert await env.post(job_id, "a1", None) == (200, {"attempt": "started"})
        status, body = await env.post(4, "a1", None)  # idempotent, even when the spec is missing
        assert status == 200 and body["attempt"] in ("running", "finished")
        await env.wait_for(lambda evs: all(completed(j)(evs) for j in (1, 2, 3, 4)))
        assert await env.log(1, "a1") == (200, b"from the store\n")
        assert await env.post(4, "a1", None) == (200, {"attempt": "finished"})
        assert await env.free_mcpu() == 4000  # every attempt gave its cores back
        await env.settle()
    for job_id in (1, 2, 3, 4):
        kinds = [type(e) for e in env.events if getattr(e, "job_id", None) == job_id]
        assert kinds == [JobStarted, JobCompleted], job_id
    states = {j: (m.state, m.exit_code) for j in (1, 2, 3, 4) for m in env.of(JobCompleted, j)}
    assert states == {1: ("Success", 0), 2: ("Failed", 1), 3: ("Error", None),
                      4: ("Error", None)}
    # A spec that is not there (or is malformed) ends the attempt in an Error saying so.
    (missing,) = env.of(JobCompleted, 4)
    assert missing.error == f"spec of job {BATCH}/4 not found in the spec store"
    assert msgspec.json.decode(missing.status)["error"] == missing.error
    (malformed,) = env.of(JobCompleted, 3)
    assert (malformed.error or "").startswith(f"invalid job spec of job {BATCH}/3: ")


class _BrokenLogStore(LocalLogStore):
    """A log store whose writer fails in a way the worker does not expect (not an OSError)."""

    def writer(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> FileLogSink:
        if job_id == 2:
            raise RuntimeError("broken log store")
        return super().writer(batch_id, job_id, attempt_id, container)


async def test_the_cores_of_an_attempt_that_fails_in_the_worker_are_free_again(
        log_settings: LogSettings, tmp_path: Path) -> None:
    """The worker counts busy cores as attempts start and end, whichever way they end: an
    attempt cancelled before its process started, one whose worker step raised, one that
    ran."""
    pidfile = tmp_path / "pids"
    async with running(log_settings, tmp_path, cores_mcpu=3000,
                       store=_BrokenLogStore(tmp_path / "logs")) as env:
        assert (await env.post(1, "a1", sleeper(pidfile)))[0] == 200
        assert (await env.post(2, "a1", spec("true")))[0] == 200  # its log store raises
        assert (await env.post(3, "a1", spec("true")))[0] == 200
        await pids_in(pidfile)
        await env.wait_for(completed(3))
        for _ in range(250):  # job 2 ends without an MJC: only its attempt's end tells
            if await env.free_mcpu() == 2000:
                break
            await asyncio.sleep(0.02)
        assert await env.free_mcpu() == 2000  # job 1's core is still busy
        assert await env.post(2, "a1", spec("true")) == (200, {"attempt": "finished"})
        assert await env.delete(1, "a1") == 200
        await env.wait_for(completed(1))
        assert await env.free_mcpu() == 3000
        # Three jobs of a core each fit again.
        for job_id in (4, 5, 6):
            assert (await env.post(job_id, "a1", sleeper(tmp_path / f"p{job_id}")))[0] == 200
        assert await env.free_mcpu() == 0
        assert (await env.post(7, "a1", spec("true")))[0] == 409
        await env.settle()
    assert not env.of(JobCompleted, 2)


class _CountingSpecStore(LocalSpecStore):
    """Counts the reads that reach the store (a cached spec is not one)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads = 0

    def read(self, batch_id: int, job_id: int) -> str | None:
        self.reads += 1
        time.sleep(0.05)  # a slow disk: every attempt of the delivery is waiting meanwhile
        return super().read(batch_id, job_id)


async def test_a_delivery_of_one_bunch_reads_the_bunch_once(log_settings: LogSettings,
                                                            tmp_path: Path) -> None:
    """The attempts of a delivery wait for one read of their batch's specs instead of each
    reading the same bunch; jobs of another bunch (or without a spec) still get theirs."""
    store = _CountingSpecStore(tmp_path / "specs")
    store.write_bunch(BATCH, [(j, msgspec.json.encode(spec("true")).decode())
                              for j in range(1, 41)])
    store.write_bunch(BATCH, [(j, msgspec.json.encode(spec("false")).decode())
                              for j in range(41, 61)])
    jobs = [*range(1, 61), 99]  # 99: no spec anywhere
    async with running(log_settings, tmp_path, cores_mcpu=100_000, specs=store) as env:
        async with WorkerClient(timeout_s=5, concurrency=10) as client:
            results = await client.deliver_many(env.worker.address, [
                Attempt(batch_id=BATCH, job_id=j, attempt_id="a1", user="alice",
                        cores_mcpu=1000) for j in jobs])
        assert results == [Delivery.ACCEPTED] * len(jobs)
        await env.wait_for(lambda evs: all(completed(j)(evs) for j in jobs))
    states = {m.job_id: m.state for m in env.of(JobCompleted)}
    assert states == {**{j: "Success" for j in range(1, 41)},
                      **{j: "Failed" for j in range(41, 61)}, 99: "Error"}
    # One read per bunch, and the missing spec's (the second bunch may be found by the
    # read of another job of it, or by one of its own): never one per attempt.
    assert 2 <= store.reads <= 4, store.reads


async def test_an_event_put_in_the_outbox_goes_out_even_when_its_waiter_is_cancelled(
        log_settings: LogSettings) -> None:
    # The worker cancels an attempt's task when it shuts down or abandons it: what it put in
    # the outbox before that still reaches the log, with the events put after it.
    log_settings = msgspec.structs.replace(log_settings, partitions=1)
    await bootstrap_topics(log_settings)
    beats = [AttemptHeartbeat(batch_id=BATCH, job_id=j, attempt_id="a1", instance_name="w-1",
                              rollup_time_ms=j) for j in (1, 2, 3)]
    options = ConsumerOptions(name="reader", topics=[TOPIC_BATCH], group=False)
    async with Publisher(log_settings) as publisher, LogConsumer(log_settings,
                                                                 options) as consumer:
        outbox = Outbox(publisher, linger_s=0.2, retry_s=0.05, max_retry_s=1.0)
        try:
            first = asyncio.create_task(outbox.put(beats[0]))
            await asyncio.sleep(0.02)  # in the outbox, lingering
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await asyncio.gather(outbox.put(beats[1]), outbox.put(beats[2]))
        finally:
            await outbox.close()
        seen: list[Event] = []
        async with asyncio.timeout(30):
            while not all(b in seen for b in beats):
                seen += [r.envelope.event for r in await consumer.next_batch()]
    assert [e for e in seen if e in beats] == beats
