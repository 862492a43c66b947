"""The GCP driver through the real google-cloud-compute client against a local fake of the
Compute Engine API (tests/fakes/gce.py): the requests it sends and what it makes of answers."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.settings import LogSettings, Settings
from services.scheduler.drivers import InstanceSpec, create_driver
from services.scheduler.drivers.cloud import load_cloud_worker_settings, startup_script
from services.scheduler.drivers.gcp import GcpDriver, gce_machine_type, load_gcp_settings
from tests.fakes.gce import FakeGce
from tests.integration.driver_contract import check_driver_contract

pytestmark = [pytest.mark.integration]

SETTINGS = Settings(log=LogSettings(bootstrap_servers="kafka-0:9092,kafka-1:9092",
                                    topic_prefix="prod-"))


def env_for(fake: FakeGce, **more: str) -> dict[str, str]:
    return {"HS_GCP_PROJECT": "proj", "HS_GCP_ZONE": "us-central1-b",
            "HS_GCP_IMAGE": "projects/cos-cloud/global/images/family/cos-stable",
            "HS_GCP_NETWORK": "hs-net", "HS_GCP_SUBNETWORK": "hs-subnet",
            "HS_GCP_SERVICE_ACCOUNT": "worker@proj.iam.gserviceaccount.com",
            "HS_GCP_COMPUTE_ENDPOINT": fake.url, "HS_CLOUD_DEPLOYMENT": "dep",
            "HS_STORAGE_URL": "gs://hs-bucket/prod", "HS_WORKER_IMAGE": "gcr.io/proj/hs:1",
            "HS_CLOUD_WORKER_ENV": '{"HS_WORKER_HEARTBEAT_S": "30"}',
            "HS_CLOUD_CREATE_WAIT_S": "10", **more}


@pytest.fixture
async def fake() -> AsyncIterator[FakeGce]:
    async with FakeGce() as fake:
        yield fake


@pytest.fixture
async def driver(fake: FakeGce) -> AsyncIterator[GcpDriver]:
    driver = create_driver("gcp", SETTINGS, env_for(fake))
    assert isinstance(driver, GcpDriver)
    yield driver
    await driver.close()


def spec(name: str, *, machine_type: str = "local-highmem-np-16", cores_mcpu: int = 16_000,
         preemptible: bool = False, inst_coll: str = "highmem-np") -> InstanceSpec:
    return InstanceSpec(name=name, inst_coll=inst_coll, machine_type=machine_type,
                        cores_mcpu=cores_mcpu, region="us-central1", preemptible=preemptible)


async def test_create_inserts_a_vm_that_starts_the_worker(fake: FakeGce,
                                                          driver: GcpDriver) -> None:
    await driver.create(spec("highmem-np-1a2b"))
    (insert,) = fake.calls("POST", "/instances")
    assert insert.path == "/compute/v1/projects/proj/zones/us-central1-b/instances"
    body = insert.body
    assert body["name"] == "highmem-np-1a2b"
    assert body["machineType"] == "zones/us-central1-b/machineTypes/n1-highmem-16"
    (disk,) = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == \
        "projects/cos-cloud/global/images/family/cos-stable"
    assert int(disk["initializeParams"]["diskSizeGb"]) == 20
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "projects/proj/global/networks/hs-net"
    assert nic["subnetwork"] == "projects/proj/regions/us-central1/subnetworks/hs-subnet"
    assert "accessConfigs" not in nic or nic["accessConfigs"] == []  # no external address
    assert body["labels"] == {"hailstream": "dep", "inst_coll": "highmem-np",
                              "hailstream-region": "us-central1", "preemptible": "false"}
    assert body["serviceAccounts"] == [{"email": "worker@proj.iam.gserviceaccount.com",
                                        "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    (item,) = body["metadata"]["items"]
    assert item["key"] == "startup-script"
    script = item["value"]
    assert script.startswith("#!/bin/bash\n")
    for line in ("export HS_KAFKA_BOOTSTRAP=kafka-0:9092,kafka-1:9092",
                 "export HS_TOPIC_PREFIX=prod-",
                 "export HS_STORAGE_URL=gs://hs-bucket/prod",
                 "export HS_WORKER_INSTANCE_NAME=highmem-np-1a2b",
                 "export HS_WORKER_CORES_MCPU=16000", "export HS_WORKER_PORT=5001",
                 "export HS_WORKER_REGION=us-central1", "export HS_WORKER_HOST=0.0.0.0",
                 "export HS_WORKER_HEARTBEAT_S=30", "export HS_WORKER_ADVERTISE_HOST"):
        assert line in script.splitlines(), line
    last = script.splitlines()[-1]
    assert last.startswith("exec docker run --rm --name hailstream-worker --network host ")
    assert last.endswith(" gcr.io/proj/hs:1 python -m services.worker")
    assert "-e HS_WORKER_ADVERTISE_HOST" in last and "-e HS_KAFKA_BOOTSTRAP" in last
    # The driver waited for the zone operation of its insert.
    (wait,) = fake.calls("POST", "/wait")
    assert wait.path == ("/compute/v1/projects/proj/zones/us-central1-b/operations/"
                         "operation-1/wait")
    assert fake.names() == ["highmem-np-1a2b"]


async def test_preemptible_instances_are_spot_vms_deleted_on_preemption(
        fake: FakeGce, driver: GcpDriver) -> None:
    await driver.create(spec("highcpu-1", machine_type="local-highcpu-8", cores_mcpu=8000,
                             preemptible=True, inst_coll="highcpu"))
    body = fake.calls("POST", "/instances")[0].body
    assert body["machineType"].endswith("/machineTypes/n1-highcpu-8")
    assert body["scheduling"] == {"provisioningModel": "SPOT",
                                  "instanceTerminationAction": "DELETE",
                                  "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    assert body["labels"]["preemptible"] == "true"


async def test_create_and_delete_are_idempotent_by_name(fake: FakeGce,
                                                        driver: GcpDriver) -> None:
    await driver.create(spec("w-1"))
    await driver.create(spec("w-1"))  # 409 from the API: a no-op
    assert fake.names() == ["w-1"]
    inserts = fake.calls("POST", "/instances")
    assert len(inserts) == 2 and len(fake.calls("POST", "/wait")) == 1
    await driver.delete("w-1")
    await driver.delete("w-1")  # 404 from the API: a no-op
    await driver.delete("never-created")
    assert fake.names() == []
    deletes = fake.calls("DELETE")
    assert [d.path.rsplit("/", 1)[1] for d in deletes] == ["w-1", "w-1", "never-created"]
    assert deletes[0].path == "/compute/v1/projects/proj/zones/us-central1-b/instances/w-1"
    assert len(fake.calls("POST", "/wait")) == 1  # delete does not wait


async def test_list_maps_states_and_addresses_of_this_deployment_only(
        fake: FakeGce, driver: GcpDriver) -> None:
    for name in ("w-a", "w-b", "w-c", "w-d"):
        await driver.create(spec(name))
    fake.set_status("w-a", "RUNNING")
    fake.set_status("w-b", "STAGING")
    fake.set_status("w-c", "TERMINATED")
    fake.set_status("w-d", "STOPPING")
    # A VM of another deployment, in the same zone: not ours.
    fake.instances[("proj", "us-central1-b", "other")] = {
        "name": "other", "status": "RUNNING", "labels": {"hailstream": "someone-else"}}
    infos = {i.name: i for i in await driver.list()}
    assert {n: i.state for n, i in infos.items()} == {
        "w-a": "running", "w-b": "running", "w-c": "stopped", "w-d": "stopped"}
    assert {i.inst_coll for i in infos.values()} == {"highmem-np"}
    addresses = [infos[n].address for n in ("w-a", "w-b", "w-c", "w-d")]
    assert addresses == [f"10.0.0.{n}:5001" for n in (2, 3, 4, 5)]
    lists = fake.calls("GET", "/instances")
    assert lists[0].query["filter"] == "labels.hailstream=dep"
    assert len(lists) == 2 and lists[1].query["pageToken"] == "2"  # pages of two
    # Freshly inserted VMs are PROVISIONING: running (their worker is on its way).
    await driver.create(spec("w-e"))
    assert {i.name: i.state for i in await driver.list()}["w-e"] == "running"


async def test_a_failed_insert_operation_fails_the_create(fake: FakeGce,
                                                          driver: GcpDriver) -> None:
    fake.fail_next_insert = {"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                             "message": "The zone does not have enough resources"}
    with pytest.raises(RuntimeError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        await driver.create(spec("w-1"))
    assert fake.names() == []
    await driver.create(spec("w-1"))  # the next try goes through
    assert fake.names() == ["w-1"]


async def test_create_waits_for_its_operation_but_not_forever(fake: FakeGce) -> None:
    fake.polls_until_done = 3
    driver = create_driver("gcp", SETTINGS, env_for(fake))
    await driver.create(spec("w-slow"))
    assert len(fake.calls("POST", "/wait")) == 3
    fake.polls_until_done = 10**9
    short = create_driver("gcp", SETTINGS, env_for(fake, HS_CLOUD_CREATE_WAIT_S="0.3"))
    await short.create(spec("w-never-done"))  # returns: the activation timeout takes over
    assert "w-never-done" in fake.names()
    await driver.close()
    await short.close()


async def test_the_shared_driver_contract(fake: FakeGce) -> None:
    await check_driver_contract(create_driver("gcp", SETTINGS, env_for(fake)))


@pytest.mark.parametrize(("machine_type", "cores_mcpu", "expected"), [
    ("local-standard-16", 16_000, "n1-standard-16"),
    ("local-highcpu-np-8", 8_000, "n1-highcpu-8"),
    ("local-highmem-32", 32_000, "n1-highmem-32"),
    ("job-private", 3_000, "n1-standard-4"),
    ("job-private", 250, "n1-standard-1"),
    ("n1-highmem-32", 32_000, "n1-highmem-32"),
    ("e2-standard-4", 4_000, "e2-standard-4"),
], ids=lambda v: str(v))
def test_machine_types(machine_type: str, cores_mcpu: int, expected: str) -> None:
    assert gce_machine_type(spec("w", machine_type=machine_type,
                                 cores_mcpu=cores_mcpu)) == expected


@pytest.mark.parametrize("machine_type", ["local-2", "local-gpu-4", "job-private"])
def test_machine_types_that_do_not_fit(machine_type: str) -> None:
    with pytest.raises(ValueError, match="machine"):
        gce_machine_type(spec("w", machine_type=machine_type, cores_mcpu=200_000))


@pytest.mark.parametrize("var", ["HS_GCP_PROJECT", "HS_GCP_ZONE", "HS_GCP_IMAGE"])
def test_a_missing_setting_is_named(var: str) -> None:
    env = {"HS_GCP_PROJECT": "p", "HS_GCP_ZONE": "z-a", "HS_GCP_IMAGE": "i"}
    del env[var]
    with pytest.raises(ValueError, match=f"{var} is not set: the gcp compute driver"):
        create_driver("gcp", SETTINGS, env)


def test_settings_defaults() -> None:
    gcp = load_gcp_settings({"HS_GCP_PROJECT": "p", "HS_GCP_ZONE": "europe-west1-c",
                             "HS_GCP_IMAGE": "i"})
    assert (gcp.network, gcp.subnetwork, gcp.endpoint, gcp.region) == (
        "default", None, None, "europe-west1")
    worker = load_cloud_worker_settings(SETTINGS, {})
    assert (worker.image, worker.port, worker.deployment) == (None, 5001, "hailstream")
    assert worker.env["HS_KAFKA_BOOTSTRAP"] == "kafka-0:9092,kafka-1:9092"
    assert "HS_STORAGE_URL" not in worker.env
    for bad in ({"HS_CLOUD_WORKER_ENV": "[1]"}, {"HS_CLOUD_WORKER_ENV": "{"},
                {"HS_CLOUD_DEPLOYMENT": "Has Spaces"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            load_cloud_worker_settings(SETTINGS, bad)


def test_the_startup_script_runs_the_worker_with_its_settings(tmp_path: Path) -> None:
    """Run the boot script with bash; a stand-in Python records the worker's environment."""
    dump = tmp_path / "env.txt"
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args.txt\nenv > {dump}\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    worker = load_cloud_worker_settings(SETTINGS, {
        "HS_WORKER_PYTHON": str(python),
        "HS_CLOUD_WORKER_ENV": '{"HS_WORKER_SCRATCH_DIR": "/mnt/a dir/it\'s"}'})
    script = startup_script(worker, spec("w-9", cores_mcpu=4000), cloud="gcp")
    subprocess.run(["bash", "-c", script], check=True, timeout=30,
                   env={"PATH": os.environ["PATH"]})
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert (tmp_path / "args.txt").read_text() == "-m services.worker\n"
    assert env["HS_WORKER_INSTANCE_NAME"] == "w-9" and env["HS_WORKER_CORES_MCPU"] == "4000"
    assert env["HS_WORKER_SCRATCH_DIR"] == "/mnt/a dir/it's"  # quoted safely
    assert env["HS_KAFKA_BOOTSTRAP"] == "kafka-0:9092,kafka-1:9092"
    assert env["HS_WORKER_HOST"] == "0.0.0.0"
    assert env["HS_WORKER_ADVERTISE_HOST"]  # this machine's first address
    assert base64.b64decode(base64.b64encode(script.encode())).decode() == script
