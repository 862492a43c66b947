"""The Azure driver through the real azure-mgmt-compute (aio) client against a local HTTPS fake
of Azure Resource Manager (tests/fakes/azure_compute.py): the requests it sends and what it makes
of the answers."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

from services.common.settings import LogSettings, Settings
from services.scheduler.drivers import InstanceSpec, create_driver
from services.scheduler.drivers.azure import AzureDriver, azure_vm_size, load_azure_settings
from tests.fakes import self_signed_cert
from tests.fakes.azure_compute import FakeAzure
from tests.integration.driver_contract import check_driver_contract

pytestmark = [pytest.mark.integration]

SETTINGS = Settings(log=LogSettings(bootstrap_servers="kafka:9092"))
SUB = "00000000-0000-0000-0000-000000000001"
SUBNET = (f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network/"
          "virtualNetworks/hs-vnet/subnets/workers")
VMS = f"/subscriptions/{SUB}/resourceGroups/hs-rg/providers/Microsoft.Compute/virtualMachines"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def fake(certificate: tuple[Path, Path]) -> AsyncIterator[FakeAzure]:
    async with FakeAzure(certificate=certificate) as fake:
        yield fake


def env_for(fake: FakeAzure, certificate: tuple[Path, Path], **more: str) -> dict[str, str]:
    return {"HS_AZURE_SUBSCRIPTION_ID": SUB, "HS_AZURE_RESOURCE_GROUP": "hs-rg",
            "HS_AZURE_LOCATION": "eastus", "HS_AZURE_SUBNET_ID": SUBNET,
            "HS_AZURE_IMAGE": "Canonical:ubuntu-24_04-lts:server:latest",
            "HS_AZURE_ENDPOINT": fake.url, "HS_AZURE_CA_BUNDLE": str(certificate[0]),
            "HS_AZURE_TOKEN": fake.token, "HS_AZURE_POLL_S": "0.01",
            "HS_AZURE_SSH_PUBLIC_KEY": "ssh-ed25519 AAAAkey ops@example",
            "HS_CLOUD_DEPLOYMENT": "dep", "HS_STORAGE_URL": "gs://hs-bucket/prod",
            "HS_CLOUD_CREATE_WAIT_S": "10", **more}


@pytest.fixture
async def driver(fake: FakeAzure, certificate: tuple[Path, Path]) -> AsyncIterator[AzureDriver]:
    driver = create_driver("azure", SETTINGS, env_for(fake, certificate))
    assert isinstance(driver, AzureDriver)
    yield driver
    await driver.close()


def spec(name: str, *, machine_type: str = "local-highmem-np-16", cores_mcpu: int = 16_000,
         preemptible: bool = False, inst_coll: str = "highmem-np") -> InstanceSpec:
    return InstanceSpec(name=name, inst_coll=inst_coll, machine_type=machine_type,
                        cores_mcpu=cores_mcpu, region="eastus", preemptible=preemptible)


async def test_create_puts_a_vm_that_starts_the_worker(fake: FakeAzure,
                                                       driver: AzureDriver) -> None:
    await driver.create(spec("highmem-np-1a2b"))
    (put,) = fake.calls("PUT")
    assert put.path == f"{VMS}/highmem-np-1a2b"
    assert put.query["api-version"] >= "2020-06-01"  # inline NIC configurations
    assert put.headers["If-None-Match"] == "*"
    assert put.headers["Authorization"] == f"Bearer {fake.token}"
    body = put.body
    assert body["location"] == "eastus"
    assert body["tags"] == {"hailstream": "dep", "inst_coll": "highmem-np",
                            "hailstream-region": "eastus", "preemptible": "false"}
    props = body["properties"]
    assert props["hardwareProfile"] == {"vmSize": "Standard_E16s_v5"}
    assert props["priority"] == "Regular" and "evictionPolicy" not in props
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server",
        "version": "latest"}
    assert props["storageProfile"]["osDisk"] == {"createOption": "FromImage",
                                                 "deleteOption": "Delete", "diskSizeGB": 30}
    (nic,) = props["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["name"] == "highmem-np-1a2b-nic"
    assert nic["properties"]["deleteOption"] == "Delete" and nic["properties"]["primary"]
    (ip,) = nic["properties"]["ipConfigurations"]
    assert ip["properties"]["subnet"] == {"id": SUBNET}
    os_profile = props["osProfile"]
    assert os_profile["computerName"] == "highmem-np-1a2b"
    assert os_profile["adminUsername"] == "hailstream" and "adminPassword" not in os_profile
    assert os_profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert os_profile["linuxConfiguration"]["ssh"]["publicKeys"] == [{
        "path": "/home/hailstream/.ssh/authorized_keys",
        "keyData": "ssh-ed25519 AAAAkey ops@example"}]
    script = base64.b64decode(os_profile["customData"]).decode()
    assert script.startswith("#!/bin/bash\n")
    lines = script.splitlines()
    for line in ("export HS_KAFKA_BOOTSTRAP=kafka:9092",
                 "export HS_STORAGE_URL=gs://hs-bucket/prod",
                 "export HS_WORKER_INSTANCE_NAME=highmem-np-1a2b",
                 "export HS_WORKER_CORES_MCPU=16000", "export HS_WORKER_REGION=eastus",
                 "export HS_WORKER_HOST=0.0.0.0", "export HS_WORKER_ADVERTISE_HOST"):
        assert line in lines, line
    assert lines[-1] == "exec python3 -m services.worker"  # no HS_WORKER_IMAGE
    # The driver waited for the asynchronous operation, then read the VM.
    assert len(fake.calls("GET", "/operations/op-1")) == 1
    assert fake.names() == ["highmem-np-1a2b"]


async def test_preemptible_instances_are_spot_vms_deleted_on_eviction(
        fake: FakeAzure, driver: AzureDriver) -> None:
    await driver.create(spec("highcpu-1", machine_type="local-highcpu-8", cores_mcpu=8000,
                             preemptible=True, inst_coll="highcpu"))
    props = fake.calls("PUT")[0].body["properties"]
    assert props["hardwareProfile"] == {"vmSize": "Standard_F8s_v2"}
    assert (props["priority"], props["evictionPolicy"]) == ("Spot", "Delete")
    assert props["billingProfile"] == {"maxPrice": -1}


async def test_create_and_delete_are_idempotent_by_name(fake: FakeAzure,
                                                        driver: AzureDriver) -> None:
    await driver.create(spec("w-1"))
    before = dict(fake.vms[("hs-rg", "w-1")]["properties"])
    await driver.create(spec("w-1", machine_type="local-standard-32"))  # 412: a no-op
    assert fake.names() == ["w-1"]
    assert fake.vms[("hs-rg", "w-1")]["properties"] == before  # not updated
    assert len(fake.calls("PUT")) == 2
    await driver.delete("w-1")
    assert fake.names() == [] and fake.nics == {}  # the inline NIC goes with its VM
    await driver.delete("w-1")  # ARM answers 204
    await driver.delete("never-created")
    deletes = fake.calls("DELETE")
    assert [d.path for d in deletes] == [f"{VMS}/w-1", f"{VMS}/w-1", f"{VMS}/never-created"]
    fake.resource_groups.clear()
    await driver.delete("w-1")  # 404 (no resource group): nothing to delete either


async def test_list_maps_states_and_addresses_of_this_deployment_only(
        fake: FakeAzure, driver: AzureDriver) -> None:
    for name in ("w-a", "w-b", "w-c", "w-d", "w-e"):
        await driver.create(spec(name))
    fake.set_power("w-b", "deallocated")
    fake.set_power("w-c", None, provisioning="Creating")  # no power state yet
    fake.set_power("w-d", "stopped")
    fake.set_power("w-e", None, provisioning="Failed")
    other = dict(fake.vms[("hs-rg", "w-a")], name="other", tags={"hailstream": "else"})
    fake.vms[("hs-rg", "other")] = other
    infos = {i.name: i for i in await driver.list()}
    assert {n: i.state for n, i in infos.items()} == {
        "w-a": "running", "w-b": "stopped", "w-c": "running", "w-d": "stopped",
        "w-e": "stopped"}
    assert {i.inst_coll for i in infos.values()} == {"highmem-np"}
    assert [infos[n].address for n in ("w-a", "w-b", "w-c")] == [
        "10.1.0.4:5001", "10.1.0.5:5001", "10.1.0.6:5001"]
    lists = fake.calls("GET", "/virtualMachines")
    lists = [r for r in lists if r.path == VMS]
    assert lists[0].query["$expand"] == "instanceView"
    assert len(lists) == 3  # six VMs in pages of two
    nic_lists = fake.calls("GET", "/networkInterfaces")
    assert len(nic_lists) == 3 and nic_lists[0].query["api-version"]


async def test_a_failed_creation_fails_the_create(fake: FakeAzure, driver: AzureDriver) -> None:
    fake.fail_next_create = {"code": "AllocationFailed",
                             "message": "Allocation failed. We do not have sufficient capacity"}
    with pytest.raises(RuntimeError, match="Allocation failed"):
        await driver.create(spec("w-1"))
    (info,) = await driver.list()
    assert info.state == "stopped"  # the scheduler deletes it


async def test_create_waits_for_its_operation_but_not_forever(
        fake: FakeAzure, certificate: tuple[Path, Path]) -> None:
    fake.polls_until_done = 3
    driver = create_driver("azure", SETTINGS, env_for(fake, certificate))
    await driver.create(spec("w-slow"))
    assert len(fake.calls("GET", "/operations/")) == 3
    fake.polls_until_done = 10**9
    short = create_driver("azure", SETTINGS,
                          env_for(fake, certificate, HS_CLOUD_CREATE_WAIT_S="0.3"))
    await short.create(spec("w-never-done"))  # returns: the activation timeout takes over
    assert "w-never-done" in fake.names()
    await driver.close()
    await short.close()


async def test_the_shared_driver_contract(fake: FakeAzure,
                                          certificate: tuple[Path, Path]) -> None:
    await check_driver_contract(create_driver("azure", SETTINGS, env_for(fake, certificate)))


async def test_tls_is_verified_and_plain_http_refused(fake: FakeAzure,
                                                      certificate: tuple[Path, Path]) -> None:
    # Without the fake's CA the certificate does not verify: verification stays on.
    unverified = create_driver("azure", SETTINGS, {
        **env_for(fake, certificate), "HS_AZURE_CA_BUNDLE": ""})
    with pytest.raises(ServiceRequestError):
        await unverified.list()
    await unverified.close()
    # azure-core's bearer-token policy never sends a token over plain HTTP.
    plain = create_driver("azure", SETTINGS, {
        **env_for(fake, certificate), "HS_AZURE_ENDPOINT": f"http://127.0.0.1:{fake.port}"})
    with pytest.raises(ServiceRequestError, match=r"non-TLS|https"):
        await plain.list()
    await plain.close()
    wrong = create_driver("azure", SETTINGS, {**env_for(fake, certificate),
                                              "HS_AZURE_TOKEN": "wrong"})
    with pytest.raises(ClientAuthenticationError):
        await wrong.create(spec("w-1"))
    await wrong.close()
    assert fake.names() == []


async def test_without_a_token_the_managed_identity_is_used(
        fake: FakeAzure, certificate: tuple[Path, Path]) -> None:
    async with FakeAzure(token=fake.token) as imds:  # IMDS is plain HTTP on 169.254.169.254
        env = {**env_for(fake, certificate), "HS_AZURE_TOKEN": "",
               "HS_AZURE_IMDS_ENDPOINT": f"{imds.url}/metadata/identity/oauth2/token",
               "HS_AZURE_CLIENT_ID": "client-1"}
        async with create_driver("azure", SETTINGS, env) as driver:  # type: ignore[attr-defined]
            await driver.create(spec("w-1"))
            assert [i.name for i in await driver.list()] == ["w-1"]
        (call,) = imds.calls("GET")  # cached for every later request
        assert call.headers["Metadata"] == "true"
        assert call.query == {"api-version": "2018-02-01",
                              "resource": "https://management.azure.com",
                              "client_id": "client-1"}


async def test_without_an_ssh_key_the_admin_password_is_random(
        fake: FakeAzure, certificate: tuple[Path, Path]) -> None:
    env = {**env_for(fake, certificate), "HS_AZURE_SSH_PUBLIC_KEY": ""}
    async with create_driver("azure", SETTINGS, env) as driver:  # type: ignore[attr-defined]
        await driver.create(spec("w-1"))
        await driver.create(spec("w-2"))
    first, second = (c.body["properties"]["osProfile"] for c in fake.calls("PUT"))
    assert first["linuxConfiguration"]["disablePasswordAuthentication"] is False
    assert len(first["adminPassword"]) >= 32 and first["adminPassword"] != second["adminPassword"]


@pytest.mark.parametrize(("machine_type", "cores_mcpu", "expected"), [
    ("local-standard-16", 16_000, "Standard_D16s_v5"),
    ("local-highcpu-np-8", 8_000, "Standard_F8s_v2"),
    ("local-highmem-32", 32_000, "Standard_E32s_v5"),
    ("job-private", 3_000, "Standard_D4s_v5"),
    ("job-private", 250, "Standard_D2s_v5"),
    ("n1-standard-1", 1_000, "Standard_D2s_v5"),
    ("n1-highmem-20", 20_000, "Standard_E20s_v5"),
    ("Standard_NC6s_v3", 6_000, "Standard_NC6s_v3"),
], ids=lambda v: str(v))
def test_vm_sizes(machine_type: str, cores_mcpu: int, expected: str) -> None:
    assert azure_vm_size(spec("w", machine_type=machine_type, cores_mcpu=cores_mcpu)) == expected


@pytest.mark.parametrize("machine_type", ["local-2", "e2-medium", "n1-highcpu-128"])
def test_vm_sizes_that_do_not_fit(machine_type: str) -> None:
    with pytest.raises(ValueError, match=r"Azure|machine"):
        azure_vm_size(spec("w", machine_type=machine_type))


@pytest.mark.parametrize("var", ["HS_AZURE_SUBSCRIPTION_ID", "HS_AZURE_RESOURCE_GROUP",
                                 "HS_AZURE_LOCATION", "HS_AZURE_SUBNET_ID", "HS_AZURE_IMAGE"])
def test_a_missing_setting_is_named(var: str) -> None:
    env = {"HS_AZURE_SUBSCRIPTION_ID": SUB, "HS_AZURE_RESOURCE_GROUP": "rg",
           "HS_AZURE_LOCATION": "eastus", "HS_AZURE_SUBNET_ID": SUBNET,
           "HS_AZURE_IMAGE": "/subscriptions/x/images/y", var: ""}
    with pytest.raises(ValueError, match=f"{var} is not set: the azure compute driver"):
        create_driver("azure", SETTINGS, env)


def test_images_are_resource_ids_or_urns() -> None:
    base = {"HS_AZURE_SUBSCRIPTION_ID": SUB, "HS_AZURE_RESOURCE_GROUP": "rg",
            "HS_AZURE_LOCATION": "eastus", "HS_AZURE_SUBNET_ID": SUBNET}
    settings = load_azure_settings({**base, "HS_AZURE_IMAGE": "/subscriptions/x/images/y"})
    assert (settings.endpoint, settings.token, settings.ca_bundle) == (
        "https://management.azure.com", None, None)
    with pytest.raises(ValueError, match="HS_AZURE_IMAGE"):
        load_azure_settings({**base, "HS_AZURE_IMAGE": "ubuntu"})
