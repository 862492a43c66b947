"""Specs and logs in GCS through the real google-cloud-storage client, against
gcp-storage-emulator (a subprocess on a free port)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from google.cloud import storage

from schemas.base import Event
from schemas.execution import JobCompleted
from schemas.infra import InstanceActivated
from services.common import procs
from services.common.gcs import GcsLogStore, GcsSpecStore, gcs_client, parse_gs_url
from services.common.log import ConsumerOptions, LogConsumer, bootstrap_topics
from services.common.settings import TOPIC_BATCH, TOPIC_SCHEDULER, LogSettings, Settings
from services.common.specstore import LocalSpecStore
from services.common.storage import (
    StorageSettings,
    load_storage_settings,
    open_log_store,
    open_spec_store,
    storage_env,
)
from services.scheduler.drivers import InstanceSpec
from services.scheduler.drivers.local import LocalDriver, LocalDriverOptions
from services.worker.logstore import LocalLogStore

pytestmark = [pytest.mark.integration]

BUCKET = "hs-test"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = procs.free_port()
    log = Path(tmp_path_factory.mktemp("gcs")) / "emulator.log"
    proc = procs.spawn([sys.executable, "-m", "gcp_storage_emulator", "start", "--port",
                        str(port), "--host", "127.0.0.1", "--in-memory",
                        "--default-bucket", BUCKET], log_path=log)
    try:
        procs.wait_for_port(port, timeout=30, proc=proc, what="gcp-storage-emulator")
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.terminate(proc.pid)
        proc.wait(timeout=10)


@pytest.fixture
def settings(emulator: str, request: pytest.FixtureRequest, tmp_path: Path) -> StorageSettings:
    # A prefix per test: tests never see each other's objects.
    return StorageSettings(url=f"gs://{BUCKET}/run/{request.node.name}", gcs_endpoint=emulator,
                           spool_dir=str(tmp_path / "spool"))


@pytest.fixture
def bucket(emulator: str) -> Iterator[storage.Bucket]:
    client = gcs_client(endpoint=emulator)
    yield client.bucket(BUCKET)
    client.close()


def spec(n: int) -> str:
    return msgspec.json.encode({"process": {"command": ["echo", str(n)]}}).decode()


def test_specs_round_trip_in_bunches_like_the_local_store(settings: StorageSettings,
                                                          bucket: storage.Bucket,
                                                          tmp_path: Path) -> None:
    store = open_spec_store(tmp_path / "unused", settings)
    assert isinstance(store, GcsSpecStore)
    assert store.read(7, 1) is None  # no batch at all
    store.write_bunch(7, [(1, spec(1)), (2, spec(2)), (5, spec(5))])
    store.write_bunch(7, [(6, spec(6)), (9, spec(9))])
    assert [store.read(7, j) for j in (1, 2, 5, 6, 9)] == [spec(j) for j in (1, 2, 5, 6, 9)]
    assert [store.read(7, j) for j in (0, 3, 7, 10)] == [None] * 4  # gaps and ends
    assert store.read(8, 1) is None

    # Objects mirror the local layout, with the local store's bytes.
    prefix = parse_gs_url(settings.url or "")[1]
    names = sorted(b.name for b in bucket.client.list_blobs(bucket, prefix=prefix + "/"))
    assert names == [f"{prefix}/specs/7/1.specs", f"{prefix}/specs/7/6.specs"]
    local = LocalSpecStore(tmp_path / "local", fsync=False)
    local.write_bunch(7, [(1, spec(1)), (2, spec(2)), (5, spec(5))])
    assert bucket.blob(f"{prefix}/specs/7/1.specs").download_as_bytes() == \
        local.path(7, 1).read_bytes()
    store.write_run(7, 20, [spec(20), spec(21)])  # ingest's way: contiguous ids
    local.write_run(7, 20, [spec(20), spec(21)])
    assert bucket.blob(f"{prefix}/specs/7/20.specs").download_as_bytes() == \
        local.path(7, 20).read_bytes()
    assert [store.read(7, j) for j in (20, 21, 22)] == [spec(20), spec(21), None]

    # Another process (a worker) sees a bunch written after it cached the batch's listing.
    other = open_spec_store(tmp_path / "unused", settings)
    assert other.read(7, 12) is None
    store.write_bunch(7, [(12, spec(12))])
    assert other.read(7, 12) == spec(12)
    # A rewritten bunch (a retried request) replaces the old one.
    store.write_bunch(7, [(12, spec(120))])
    assert open_spec_store(tmp_path / "unused", settings).read(7, 12) == spec(120)
    with pytest.raises(ValueError, match="increase"):
        store.write_bunch(7, [(3, spec(3)), (3, spec(3))])


def test_an_unreachable_bucket_is_an_os_error(emulator: str, tmp_path: Path) -> None:
    # Ingest answers 503 on OSError from write_bunch; a missing bucket must surface as one.
    store = open_spec_store(tmp_path, StorageSettings(url="gs://no-such-bucket/p",
                                                      gcs_endpoint=emulator))
    with pytest.raises(OSError, match="GCS write"):
        store.write_bunch(1, [(1, spec(1))])


def test_logs_are_spooled_while_written_and_uploaded_on_close(settings: StorageSettings,
                                                              bucket: storage.Bucket,
                                                              tmp_path: Path) -> None:
    worker = open_log_store(tmp_path / "unused", settings)
    ingest = open_log_store(tmp_path / "unused", settings)
    assert isinstance(worker, GcsLogStore) and isinstance(ingest, GcsLogStore)
    assert worker.read(3, 4, "a1", "main") is None
    writer = worker.writer(3, 4, "a1", "main")
    writer.write(b"hello ")
    writer.write(b"world\n")
    # The worker running the container reads its spool; ingest sees nothing before the end.
    assert worker.read(3, 4, "a1", "main") == b"hello world\n"
    assert ingest.read(3, 4, "a1", "main") is None
    writer.close()
    writer.close()  # idempotent
    assert not writer.spool.exists()
    assert ingest.read(3, 4, "a1", "main") == b"hello world\n"
    assert worker.read(3, 4, "a1", "main") == b"hello world\n"
    assert ingest.read(3, 4, "a1", "input") is None
    assert ingest.read(3, 4, "a2", "main") is None
    prefix = parse_gs_url(settings.url or "")[1]
    assert list(ingest.object_names()) == [f"{prefix}/logs/3/4/a1/main.log"]

    # A fresh writer truncates, as the local store's does.
    with worker.writer(3, 4, "a1", "main") as again:
        again.write(b"second\n")
    assert ingest.read(3, 4, "a1", "main") == b"second\n"
    with pytest.raises(ValueError, match="invalid attempt id"):
        worker.writer(3, 4, "../x", "main")
    with pytest.raises(ValueError, match="invalid container name"):
        ingest.read(3, 4, "a1", "a/b")


def test_concurrent_writers_and_readers(settings: StorageSettings, tmp_path: Path) -> None:
    logs = open_log_store(tmp_path, settings)
    specs = open_spec_store(tmp_path, settings)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with logs.writer(100, i, "a", "main") as w:  # type: ignore[attr-defined]
                w.write(f"job {i}\n".encode())
            specs.write_bunch(100 + i, [(1, spec(i))])
            assert specs.read(100 + i, 1) == spec(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [logs.read(100, i, "a", "main") for i in range(6)] == [
        f"job {i}\n".encode() for i in range(6)]


def test_a_failed_upload_loses_the_log_but_never_raises(emulator: str, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    logs = open_log_store(tmp_path, StorageSettings(url="gs://no-such-bucket/p",
                                                    gcs_endpoint=emulator,
                                                    spool_dir=str(tmp_path / "spool")))
    writer = logs.writer(1, 1, "a", "main")
    writer.write(b"x")
    writer.close()  # must not raise: the worker closes logs while finishing an attempt
    assert "uploading the log" in caplog.text
    assert list((tmp_path / "spool" / "hs-gcs-logs").iterdir()) == []


def test_settings_choose_the_backend(tmp_path: Path) -> None:
    local = load_storage_settings({})
    assert local == StorageSettings() and local.is_local
    assert isinstance(open_spec_store(tmp_path / "s", local), LocalSpecStore)
    store = open_log_store(tmp_path / "l", local)
    assert isinstance(store, LocalLogStore) and store.root == tmp_path / "l"
    assert storage_env(local) == {}
    gcs = load_storage_settings({"HS_STORAGE_URL": "gs://b/p/q/", "HS_GCS_ENDPOINT": "http://x",
                                 "HS_GCS_SPOOL_DIR": "/s", "HS_STORAGE_URLX": "?"})
    assert gcs == StorageSettings(url="gs://b/p/q/", gcs_endpoint="http://x", spool_dir="/s")
    assert storage_env(gcs) == {"HS_STORAGE_URL": "gs://b/p/q/", "HS_GCS_ENDPOINT": "http://x"}
    assert parse_gs_url("gs://b/p/q/") == ("b", "p/q") and parse_gs_url("gs://b") == ("b", "")
    for bad in ("s3://b/p", "gs:///p", "/tmp/x"):
        with pytest.raises(ValueError, match="HS_STORAGE_URL"):
            load_storage_settings({"HS_STORAGE_URL": bad})


@pytest.mark.slow
async def test_a_worker_reads_specs_from_and_writes_logs_to_gcs(
        log_settings: LogSettings, settings: StorageSettings, tmp_path: Path) -> None:
    """A worker started by the local driver with HS_STORAGE_URL (as a cloud VM's boot script
    sets it) runs a job whose spec ingest put in GCS, and its log lands in GCS."""
    quick = msgspec.structs.replace(log_settings, partitions=1)
    await bootstrap_topics(quick)
    env = {**storage_env(settings), "HS_GCS_SPOOL_DIR": str(tmp_path / "spool"),
           "HS_WORKER_REPORT_RETRY_S": "0.05", "HS_WORKER_SHUTDOWN_REPORT_S": "1",
           "HS_WORKER_SCRATCH_DIR": str(tmp_path / "scratch"),
           # Listen on every interface, announce loopback: what a cloud VM's worker does.
           "HS_WORKER_HOST": "0.0.0.0", "HS_WORKER_ADVERTISE_HOST": "127.0.0.1"}
    open_spec_store(tmp_path / "unused", settings).write_bunch(21, [(1, msgspec.json.encode({
        "process": {"type": "docker", "image": "ubuntu:24.04",
                    "command": ["echo", "from gcs"]}}).decode())])
    options = ConsumerOptions(name="reader", topics=[TOPIC_SCHEDULER, TOPIC_BATCH], group=False)
    async with LocalDriver(Settings(log=quick, data_dir=str(tmp_path / "data")),
                           LocalDriverOptions(worker_env=env)) as driver, \
            LogConsumer(quick, options) as consumer:
        await driver.create(InstanceSpec(name="w-gcs", inst_coll="standard",
                                         machine_type="local-standard-2", cores_mcpu=2000,
                                         region="local"))
        events: list[Event] = []

        async def wait_for(kind: type[Event]) -> Event:
            async with asyncio.timeout(60):
                while True:
                    for e in events:
                        if isinstance(e, kind):
                            return e
                    events.extend(r.envelope.event for r in await consumer.next_batch())

        activated = await wait_for(InstanceActivated)
        assert isinstance(activated, InstanceActivated)
        (info,) = await driver.list()
        assert activated.address == info.address  # 127.0.0.1:{port}, as announced
        body = {"batch_id": 21, "job_id": 1, "attempt_id": "a1", "user": "alice",
                "cores_mcpu": 1000}
        async with aiohttp.ClientSession() as http, \
                http.post(f"http://{activated.address}/api/v1alpha/jobs", json=body) as r:
            assert r.status == 200, await r.text()
        mjc = await wait_for(JobCompleted)
        assert isinstance(mjc, JobCompleted)
        assert mjc.state == "Success", mjc.error
    assert open_log_store(tmp_path / "unused", settings).read(21, 1, "a1", "main") == \
        b"from gcs\n"
    assert not (tmp_path / "data" / "job-logs").exists()  # nothing went to the local root
