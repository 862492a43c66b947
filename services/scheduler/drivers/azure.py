"""The Azure compute driver: each instance is a virtual machine running a worker.

Built on azure-mgmt-compute's async ``ComputeManagementClient``. One driver serves one
subscription, resource group and location. A VM of
:class:`~services.scheduler.drivers.base.InstanceSpec` gets:

* a size (:func:`azure_vm_size`): an Azure size as named (``Standard_D8s_v5``), else by family
  and cores, the smallest of ``Standard_D{n}s_v5`` (standard, 4 GiB per core), ``Standard_F{n}s_v2``
  (highcpu, 2 GiB) or ``Standard_E{n}s_v5`` (highmem, 8 GiB) with the cores;
* the image ``HS_AZURE_IMAGE`` (a resource id, or ``publisher:offer:sku:version``), an OS disk
  deleted with the VM;
* its network interface inline (``networkProfile.networkInterfaceConfigurations``, compute API
  2020-06-01 and later) in the subnet ``HS_AZURE_SUBNET_ID``, deleted with the VM: no
  azure-mgmt-network, no NIC to create or clean up beforehand;
* ``customData``: the worker's boot script, base64 (cloud-init runs a ``#!`` script at first
  boot; :func:`~services.scheduler.drivers.cloud.startup_script`);
* tags ``hailstream={deployment}``, ``inst_coll``, ``hailstream-region``, ``preemptible``;
* when preemptible, priority ``Spot`` with eviction policy ``Delete`` and no price cap (-1).

Idempotent by name: the PUT carries ``If-None-Match: *``, so a VM that exists answers 412 (or
409) and nothing changes (a plain PUT would update the VM, or fail on its immutable customData);
deleting a VM that is not there (ARM answers 204, or 404 for a missing resource group) does
nothing. ``create`` waits for its long-running operation up to ``HS_CLOUD_CREATE_WAIT_S`` (a
failed provisioning fails the create; past the wait the scheduler's activation timeout takes
over), ``delete`` only starts it, as in the GCP driver. ``list`` returns the VMs tagged with this
deployment, with their instance view: power state ``running`` or ``starting``, or no power state
yet while provisioning, is ``running``; ``stopped``, ``deallocated``, a failed provisioning or a
deletion under way is ``stopped``. Addresses come from the resource group's network interfaces
(one plain ARM GET through the same pipeline), ``None`` if they cannot be read.

Credentials: ``HS_AZURE_TOKEN`` (a bearer token, for fakes and short jobs), else the managed
identity of the machine the scheduler runs on (IMDS). azure-core's bearer-token policy refuses
plain ``http://`` endpoints, and rightly: a fake endpoint serves HTTPS, and
``HS_AZURE_CA_BUNDLE`` names the CA file that verifies its certificate (``connection_verify``);
verification is never switched off.

| variable | default | meaning |
|---|---|---|
| ``HS_AZURE_SUBSCRIPTION_ID`` | required | the subscription |
| ``HS_AZURE_RESOURCE_GROUP`` | required | the resource group of the VMs |
| ``HS_AZURE_LOCATION`` | required | their location (``eastus``) |
| ``HS_AZURE_SUBNET_ID`` | required | the subnet's resource id |
| ``HS_AZURE_IMAGE`` | required | image resource id or ``publisher:offer:sku:version`` |
| ``HS_AZURE_ENDPOINT`` | ``https://management.azure.com`` | the ARM endpoint (a fake, in tests) |
| ``HS_AZURE_CA_BUNDLE`` | the system's | CA bundle that verifies the endpoint |
| ``HS_AZURE_TOKEN`` | none: managed identity | a bearer token |
| ``HS_AZURE_IMDS_ENDPOINT`` | IMDS' token URL | where managed identity tokens come from |
| ``HS_AZURE_CLIENT_ID`` | none | a user-assigned identity's client id |
| ``HS_AZURE_SSH_PUBLIC_KEY`` | none | the admin's SSH key (none: a random unkept password) |
| ``HS_AZURE_ADMIN_USER`` | ``hailstream`` | the VMs' admin user |
| ``HS_AZURE_DISK_GB`` | 30 | OS disk size |
| ``HS_AZURE_POLL_S`` | 5 | polling interval of long-running operations |

Plus the worker settings of :mod:`services.scheduler.drivers.cloud` (``HS_WORKER_IMAGE``...).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, Self

import aiohttp
import msgspec
from azure.core import MatchConditions
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.core.rest import HttpRequest
from azure.mgmt.compute import models
from azure.mgmt.compute.aio import ComputeManagementClient

from services.common.settings import Settings
from services.scheduler.drivers.base import InstanceInfo, InstanceSpec, InstanceState, check_name
from services.scheduler.drivers.cloud import (
    CloudWorkerSettings,
    labels,
    load_cloud_worker_settings,
    required,
    shape,
    smallest,
    startup_script,
)

log = logging.getLogger(__name__)

# Per family: the size name pattern and its core counts.
SERIES = {"standard": ("Standard_D{}s_v5", (2, 4, 8, 16, 32, 48, 64, 96)),
          "highcpu": ("Standard_F{}s_v2", (2, 4, 8, 16, 32, 48, 64, 72)),
          "highmem": ("Standard_E{}s_v5", (2, 4, 8, 16, 20, 32, 48, 64, 96))}
RUNNING_POWER = frozenset({"PowerState/running", "PowerState/starting"})
STOPPED_PROVISIONING = frozenset({"Failed", "Deleting", "Canceled"})
NETWORK_API_VERSION = "2024-05-01"
IMDS_ENDPOINT = "http://169.254.169.254/metadata/identity/oauth2/token"


class AzureSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how the Azure driver creates VMs (module docstring)."""

    subscription_id: str
    resource_group: str
    location: str
    subnet_id: str
    image: str
    endpoint: str = "https://management.azure.com"
    ca_bundle: str | None = None
    token: str | None = None
    imds_endpoint: str = IMDS_ENDPOINT
    client_id: str | None = None
    ssh_public_key: str | None = None
    admin_user: str = "hailstream"
    disk_gb: int = 30
    poll_s: float = 5.0


def load_azure_settings(env: Mapping[str, str] | None = None) -> AzureSettings:
    """The Azure settings from ``env`` (default: the process environment).

    Raises:
        ValueError: naming a required variable that is not set, or one that does not parse.
    """
    env = os.environ if env is None else env
    optional = {field: env[var] for var, field in (
        ("HS_AZURE_ENDPOINT", "endpoint"), ("HS_AZURE_CA_BUNDLE", "ca_bundle"),
        ("HS_AZURE_TOKEN", "token"), ("HS_AZURE_IMDS_ENDPOINT", "imds_endpoint"),
        ("HS_AZURE_CLIENT_ID", "client_id"), ("HS_AZURE_SSH_PUBLIC_KEY", "ssh_public_key"),
        ("HS_AZURE_ADMIN_USER", "admin_user")) if env.get(var)}
    try:
        disk_gb = int(env.get("HS_AZURE_DISK_GB") or 30)
        poll_s = float(env.get("HS_AZURE_POLL_S") or 5)
    except ValueError as e:
        raise ValueError(f"HS_AZURE_DISK_GB / HS_AZURE_POLL_S: {e}") from None
    settings = AzureSettings(
        subscription_id=required(env, "HS_AZURE_SUBSCRIPTION_ID", "azure"),
        resource_group=required(env, "HS_AZURE_RESOURCE_GROUP", "azure"),
        location=required(env, "HS_AZURE_LOCATION", "azure"),
        subnet_id=required(env, "HS_AZURE_SUBNET_ID", "azure"),
        image=required(env, "HS_AZURE_IMAGE", "azure"), disk_gb=disk_gb, poll_s=poll_s,
        **optional)
    image_reference(settings.image)  # fail now, naming the variable
    return settings


def image_reference(image: str) -> models.ImageReference:
    """The image of ``HS_AZURE_IMAGE``: a resource id or ``publisher:offer:sku:version``."""
    if image.startswith("/"):
        return models.ImageReference(id=image)
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"HS_AZURE_IMAGE: {image!r} is neither a resource id nor "
                         "publisher:offer:sku:version")
    return models.ImageReference(publisher=parts[0], offer=parts[1], sku=parts[2],
                                 version=parts[3])


def azure_vm_size(spec: InstanceSpec) -> str:
    """The VM size of ``spec`` (module docstring); ValueError for an unknown shape."""
    if spec.machine_type.startswith("Standard_"):
        return spec.machine_type
    found = shape(spec)
    if found is None:
        raise ValueError(f"no Azure VM size for {spec.machine_type!r}")
    family, cores = found
    pattern, sizes = SERIES[family]
    return pattern.format(smallest(sizes, cores, f"Azure {family}"))


class StaticTokenCredential:
    """An async TokenCredential that hands out one bearer token (``HS_AZURE_TOKEN``)."""

    def __init__(self, token: str, *, lifetime_s: int = 3600) -> None:
        self._token = token
        self._lifetime_s = lifetime_s

    async def get_token(self, *scopes: str, claims: str | None = None,
                        tenant_id: str | None = None, enable_cae: bool = False,
                        **kwargs: Any) -> AccessToken:
        return AccessToken(self._token, int(time.time()) + self._lifetime_s)

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ManagedIdentityCredential:
    """An async TokenCredential of the machine's managed identity (Azure IMDS), cached."""

    def __init__(self, endpoint: str = IMDS_ENDPOINT, *, client_id: str | None = None) -> None:
        self._endpoint = endpoint
        self._client_id = client_id
        self._session: aiohttp.ClientSession | None = None
        self._tokens: dict[str, AccessToken] = {}
        self._lock = asyncio.Lock()

    async def get_token(self, *scopes: str, claims: str | None = None,
                        tenant_id: str | None = None, enable_cae: bool = False,
                        **kwargs: Any) -> AccessToken:
        resource = scopes[0].removesuffix("/.default") if scopes else "https://management.azure.com"
        async with self._lock:
            cached = self._tokens.get(resource)
            if cached is not None and cached.expires_on - time.time() > 300:
                return cached
            params = {"api-version": "2018-02-01", "resource": resource}
            if self._client_id:
                params["client_id"] = self._client_id
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
            async with self._session.get(self._endpoint, params=params,
                                         headers={"Metadata": "true"}) as r:
                if r.status != 200:
                    raise HttpResponseError(f"managed identity token: HTTP {r.status}: "
                                            f"{(await r.text())[:200]}")
                body = await r.json(content_type=None)
            token = AccessToken(body["access_token"], int(body["expires_on"]))
            self._tokens[resource] = token
            return token

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AzureDriver:
    """Instances as Azure VMs; a :class:`ComputeDriver` and async context manager."""

    def __init__(self, azure: AzureSettings, worker: CloudWorkerSettings) -> None:
        self._azure = azure
        self._worker = worker
        self._credential: StaticTokenCredential | ManagedIdentityCredential = (
            StaticTokenCredential(azure.token) if azure.token
            else ManagedIdentityCredential(azure.imds_endpoint, client_id=azure.client_id))
        self._client = ComputeManagementClient(
            self._credential, azure.subscription_id, base_url=azure.endpoint,
            polling_interval=azure.poll_s, connection_verify=azure.ca_bundle or True)
        self._closed = False

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> AzureDriver:
        """The driver the ``HS_AZURE_*`` and cloud worker variables of ``env`` describe."""
        return cls(load_azure_settings(env), load_cloud_worker_settings(settings, env))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def virtual_machine(self, spec: InstanceSpec) -> models.VirtualMachine:
        """The VM that ``create`` puts for ``spec``."""
        a = self._azure
        script = startup_script(self._worker, spec, cloud="azure")
        if a.ssh_public_key:
            linux = models.LinuxConfiguration(
                disable_password_authentication=True,
                ssh=models.SshConfiguration(public_keys=[models.SshPublicKey(
                    path=f"/home/{a.admin_user}/.ssh/authorized_keys",
                    key_data=a.ssh_public_key)]))
            password = None
        else:  # Azure needs a credential; one nobody knows (never logged or kept)
            linux = models.LinuxConfiguration(disable_password_authentication=False)
            password = secrets.token_urlsafe(24) + "aA1!"
        ip_properties = models.VirtualMachineNetworkInterfaceIPConfigurationProperties(
            primary=True, subnet=models.SubResource(id=a.subnet_id))
        ip = models.VirtualMachineNetworkInterfaceIPConfiguration(name="ipconfig",
                                                                  properties=ip_properties)
        nic = models.VirtualMachineNetworkInterfaceConfiguration(
            name=f"{spec.name}-nic",
            properties=models.VirtualMachineNetworkInterfaceConfigurationProperties(
                primary=True, delete_option="Delete", ip_configurations=[ip]))
        spot = {"priority": "Spot", "eviction_policy": "Delete",
                "billing_profile": models.BillingProfile(max_price=-1)}
        properties = models.VirtualMachineProperties(
            hardware_profile=models.HardwareProfile(vm_size=azure_vm_size(spec)),
            storage_profile=models.StorageProfile(
                image_reference=image_reference(a.image),
                os_disk=models.OSDisk(create_option="FromImage", delete_option="Delete",
                                      disk_size_gb=a.disk_gb)),
            os_profile=models.OSProfile(
                computer_name=spec.name, admin_username=a.admin_user, admin_password=password,
                custom_data=base64.b64encode(script.encode()).decode(),
                linux_configuration=linux),
            network_profile=models.NetworkProfile(network_api_version="2020-11-01",
                                                  network_interface_configurations=[nic]),
            **(spot if spec.preemptible else {"priority": "Regular"}))
        return models.VirtualMachine(location=a.location, tags=labels(self._worker, spec),
                                     properties=properties)

    async def create(self, spec: InstanceSpec) -> None:
        if self._closed:
            raise RuntimeError("the azure driver is closed")
        check_name(spec.name)
        vm = self.virtual_machine(spec)
        try:
            poller = await self._client.virtual_machines.begin_create_or_update(
                self._azure.resource_group, spec.name, vm,
                match_condition=MatchConditions.IfMissing)
        except ResourceExistsError:
            log.info("instance %s exists already", spec.name)
            return
        log.info("instance %s: creating (%s)", spec.name, vm.hardware_profile.vm_size)
        try:
            async with asyncio.timeout(self._worker.create_wait_s):
                await poller.result()
        except TimeoutError:
            log.warning("instance %s: creation not done after %.0fs, not waiting longer",
                        spec.name, self._worker.create_wait_s)
        except HttpResponseError as e:
            raise RuntimeError(f"creating instance {spec.name} failed: {e.message}") from e

    async def delete(self, name: str) -> None:
        try:
            await self._client.virtual_machines.begin_delete(self._azure.resource_group, name)
        except ResourceNotFoundError:
            return
        log.info("instance %s: deleting", name)

    async def list(self) -> list[InstanceInfo]:
        vms = [vm async for vm in self._client.virtual_machines.list(
            self._azure.resource_group, expand="instanceView")
            if (vm.tags or {}).get("hailstream") == self._worker.deployment]
        ips = await self._private_ips() if vms else {}
        infos = []
        for vm in vms:
            ip = ips.get(str(vm.name).lower())
            infos.append(InstanceInfo(
                name=str(vm.name), inst_coll=(vm.tags or {}).get("inst_coll", ""),
                state=_state(vm), address=f"{ip}:{self._worker.port}" if ip else None))
        return infos

    async def _private_ips(self) -> dict[str, str]:
        """VM name (lower case) -> the private IP of its primary NIC, as far as known."""
        a = self._azure
        url: str | None = (f"/subscriptions/{a.subscription_id}/resourceGroups/"
                           f"{a.resource_group}/providers/Microsoft.Network/networkInterfaces"
                           f"?api-version={NETWORK_API_VERSION}")
        found: dict[str, str] = {}
        while url:
            response = await self._client.send_request(HttpRequest("GET", url))
            if response.status_code != 200:
                log.warning("listing network interfaces: HTTP %d; addresses unknown",
                            response.status_code)
                return found
            await response.read()
            page = response.json()
            for nic in page.get("value", []):
                props = nic.get("properties", {})
                vm_id = (props.get("virtualMachine") or {}).get("id", "")
                configs = props.get("ipConfigurations") or []
                primary = next((c for c in configs if c.get("properties", {}).get("primary")),
                               configs[0] if configs else None)
                ip = (primary or {}).get("properties", {}).get("privateIPAddress")
                if vm_id and ip:
                    found[vm_id.rsplit("/", 1)[-1].lower()] = ip
            url = page.get("nextLink")
        return found

    async def close(self) -> None:
        """Close the HTTP sessions (idempotent). VMs stay: they are the scheduler's state."""
        if self._closed:
            return
        self._closed = True
        await self._client.close()
        await self._credential.close()


def _state(vm: models.VirtualMachine) -> InstanceState:
    if vm.provisioning_state in STOPPED_PROVISIONING:
        return "stopped"
    view = vm.instance_view
    power = [s.code for s in (view.statuses or []) if s.code and
             s.code.startswith("PowerState/")] if view is not None else []
    if not power:  # still provisioning: the worker is on its way
        return "running"
    return "running" if power[-1] in RUNNING_POWER else "stopped"
