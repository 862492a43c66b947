"""The local compute driver against the real broker: worker processes as instances."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
import pytest

from schemas.base import Event
from schemas.execution import JobCompleted
from schemas.infra import InstanceActivated
from services.common import procs
from services.common.log import ConsumerOptions, LogConsumer, bootstrap_topics
from services.common.settings import (
    TOPIC_BATCH,
    TOPIC_SCHEDULER,
    LogSettings,
    Settings,
    load_settings,
    log_env,
)
from services.common.specstore import LocalSpecStore
from services.scheduler.drivers import InstanceSpec, create_driver
from services.scheduler.drivers.local import LocalDriver, LocalDriverOptions, reap_instances
from services.worker.logstore import LocalLogStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def spec(name: str, cores_mcpu: int = 2000) -> InstanceSpec:
    return InstanceSpec(name=name, inst_coll="standard", machine_type="local-2",
                        cores_mcpu=cores_mcpu, region="local", preemptible=False)


def workers_named(name: str) -> list[int]:
    """Pids of live processes started as the worker of instance ``name``."""
    needle = f"HS_WORKER_INSTANCE_NAME={name}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if needle in env and procs.pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def seen_as_workers(names: list[str], timeout_s: float = 10) -> bool:
    """Whether each of ``names`` has a live worker process to be found by its environment
    within ``timeout_s``. ``Popen`` returns once the child's ``execve`` has closed its
    close-on-exec descriptors, and the kernel sets up the new environment after that: under
    load, a look at once found a live worker's environment still empty (CI, 2026-12-07)."""
    deadline = time.monotonic() + timeout_s
    while not all(workers_named(n) for n in names):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(v.decode().split("=", 1) for v in raw if b"=" in v)


class Reader:
    """Events of the test's topics, read from the beginning."""

    def __init__(self, consumer: LogConsumer) -> None:
        self.consumer = consumer
        self.events: list[Event] = []

    async def wait_for(self, found: Callable[[Event], bool], timeout_s: float = 60) -> Event:
        async with asyncio.timeout(timeout_s):
            while True:
                for event in self.events:
                    if found(event):
                        return event
                self.events += [r.envelope.event for r in await self.consumer.next_batch()]


@pytest.fixture
async def quick_log(log_settings: LogSettings) -> LogSettings:
    # One partition per topic: the reader seeks each partition in turn, about 0.5 s apiece.
    settings = msgspec.structs.replace(log_settings, partitions=1)
    await bootstrap_topics(settings)
    return settings


@pytest.fixture
async def driver(quick_log: LogSettings, tmp_path: Path) -> AsyncIterator[LocalDriver]:
    options = LocalDriverOptions(worker_env={
        "HS_WORKER_REPORT_RETRY_S": "0.05", "HS_WORKER_SHUTDOWN_REPORT_S": "1",
        "HS_WORKER_SCRATCH_DIR": str(tmp_path / "scratch")})
    async with LocalDriver(Settings(log=quick_log, data_dir=str(tmp_path / "data")),
                           options) as driver:
        yield driver


@pytest.fixture
async def reader(quick_log: LogSettings) -> AsyncIterator[Reader]:
    options = ConsumerOptions(name="reader", topics=[TOPIC_SCHEDULER, TOPIC_BATCH], group=False)
    async with LogConsumer(quick_log, options) as consumer:
        yield Reader(consumer)


def activated(name: str) -> Callable[[Event], bool]:
    return lambda e: isinstance(e, InstanceActivated) and e.instance_name == name


async def test_an_instance_activates_runs_a_job_and_is_deleted(driver: LocalDriver,
                                                               reader: Reader,
                                                               tmp_path: Path) -> None:
    await driver.create(spec("w-1", cores_mcpu=3000))
    (info,) = await driver.list()
    assert (info.name, info.inst_coll, info.state) == ("w-1", "standard", "running")
    event = await reader.wait_for(activated("w-1"))
    assert isinstance(event, InstanceActivated)
    assert (event.address, event.cores_mcpu) == (info.address, 3000)
    assert driver.log_path("w-1") == (tmp_path / "data" / "instances" / "w-1.log").resolve()
    assert driver.log_path("w-1").exists()

    # The worker reads the spec from the shared spec root and writes the log to the shared log
    # root, where ingest finds them.
    data = (tmp_path / "data").resolve()
    LocalSpecStore(data / "specs").write_bunch(11, [(1, msgspec.json.encode({"process": {
        "type": "docker", "image": "ubuntu:24.04", "command": ["echo", "hi"]}}).decode())])
    body = {"batch_id": 11, "job_id": 1, "attempt_id": "a1", "user": "alice", "cores_mcpu": 1000}
    async with aiohttp.ClientSession() as http, \
            http.post(f"http://{event.address}/api/v1alpha/jobs", json=body) as r:
        assert r.status == 200, await r.text()
    mjc = await reader.wait_for(lambda e: isinstance(e, JobCompleted) and e.batch_id == 11)
    assert isinstance(mjc, JobCompleted)
    assert (mjc.state, mjc.instance_name) == ("Success", "w-1"), mjc.error
    assert LocalLogStore(data / "job-logs").read(11, 1, "a1", "main") == b"hi\n"

    pid = driver.pid("w-1")
    assert pid is not None and workers_named("w-1") == [pid]
    env = environ(pid)
    assert (env["HS_WORKER_LOG_DIR"], env["HS_WORKER_SPEC_DIR"]) == (
        str(data / "job-logs"), str(data / "specs"))
    await driver.create(spec("w-1"))  # idempotent by name
    assert driver.pid("w-1") == pid and workers_named("w-1") == [pid]
    assert [i.name for i in await driver.list()] == ["w-1"]

    port = int(info.address.rsplit(":", 1)[1]) if info.address else 0
    await driver.delete("w-1")
    assert not procs.pid_alive(pid) and workers_named("w-1") == []
    assert not procs.port_open(port)
    assert await driver.list() == [] and driver.pid("w-1") is None
    await driver.delete("w-1")  # idempotent
    await driver.delete("never-created")


async def test_a_dead_worker_is_listed_as_stopped(driver: LocalDriver, reader: Reader) -> None:
    await driver.create(spec("w-dies"))
    await driver.create(spec("w-lives"))
    await reader.wait_for(activated("w-dies"))
    pid = driver.pid("w-dies")
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        while True:  # list() notices the death when it polls the process
            if {i.name: i.state for i in await driver.list()}["w-dies"] == "stopped":
                break
            await asyncio.sleep(0.05)
    states = {i.name: i.state for i in await driver.list()}
    assert states == {"w-dies": "stopped", "w-lives": "running"}
    await driver.create(spec("w-dies"))  # the name exists: still a no-op, still stopped
    assert driver.pid("w-dies") == pid and workers_named("w-dies") == []
    await driver.delete("w-dies")
    assert [i.name for i in await driver.list()] == ["w-lives"]


async def test_close_leaves_no_processes(quick_log: LogSettings, tmp_path: Path) -> None:
    driver = create_driver("local", Settings(log=quick_log, data_dir=str(tmp_path)))
    assert isinstance(driver, LocalDriver)
    names = ["w-a", "w-b", "w-c"]
    try:
        await asyncio.gather(*(driver.create(spec(n)) for n in names))
        pids = [driver.pid(n) for n in names]
        assert all(pids) and await seen_as_workers(names)
    finally:
        await driver.close()  # a failure above leaves no process to later tests
    await driver.close()  # idempotent
    assert await driver.list() == []
    assert not any(workers_named(n) for n in names)
    assert not any(procs.pid_alive(p) for p in pids if p is not None)
    with pytest.raises(RuntimeError, match="closed"):
        await driver.create(spec("w-d"))


async def test_workers_left_by_a_dead_driver_are_reaped(quick_log: LogSettings,
                                                         tmp_path: Path) -> None:
    driver = LocalDriver(Settings(log=quick_log, data_dir=str(tmp_path / "dead")))
    other = LocalDriver(Settings(log=quick_log, data_dir=str(tmp_path / "other")))
    await asyncio.gather(driver.create(spec("w-left")), driver.create(spec("w-also")),
                         other.create(spec("w-other")))
    assert await seen_as_workers(["w-left", "w-also", "w-other"])  # as reaping finds them
    pids = [driver.pid("w-left"), driver.pid("w-also")]
    # The driver is dropped without close(), as when its scheduler is killed.
    assert await asyncio.to_thread(reap_instances, tmp_path / "dead") == ["w-also", "w-left"]
    assert not any(procs.pid_alive(p) for p in pids if p is not None)
    assert workers_named("w-other") == [other.pid("w-other")]  # another data dir: untouched
    assert await asyncio.to_thread(reap_instances, tmp_path / "dead") == []
    await other.close()
    await driver.close()


@pytest.mark.parametrize(("kind", "var"), [("gcp", "HS_GCP_PROJECT"),
                                           ("azure", "HS_AZURE_SUBSCRIPTION_ID")])
def test_cloud_drivers_name_their_missing_settings(kind: str, var: str) -> None:
    # The drivers themselves: tests/integration/test_gcp_driver.py, test_azure_driver.py.
    with pytest.raises(ValueError, match=f"{var} is not set: the {kind} compute driver"):
        create_driver(kind, Settings(), env={})


def test_unknown_driver_kinds_and_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown compute driver 'aws'"):
        create_driver("aws", Settings())
    driver = LocalDriver(Settings(data_dir=str(tmp_path)))
    for bad in ("../etc", "W-1", "", "a b"):
        with pytest.raises(ValueError, match="invalid instance name"):
            driver.log_path(bad)


def test_workers_get_the_log_settings_of_the_driver() -> None:
    env = log_env(LogSettings(bootstrap_servers="h:1", topic_prefix="p-", idempotent=True))
    assert env["HS_KAFKA_BOOTSTRAP"] == "h:1" and env["HS_TOPIC_PREFIX"] == "p-"
    assert env["HS_KAFKA_IDEMPOTENT"] == "true" and env["HS_KAFKA_COMPRESSION"] == "zstd"
    # What the child reads back is what the driver has, compression off included.
    off = LogSettings(bootstrap_servers="h:1", compression=None)
    assert log_env(off)["HS_KAFKA_COMPRESSION"] == "none"
    assert load_settings(log_env(off)).log == off
