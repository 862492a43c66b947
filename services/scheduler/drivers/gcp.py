"""The GCP compute driver: each instance is a Compute Engine VM running a worker.

Built on google-cloud-compute's ``InstancesClient`` (REST; blocking calls run in a thread). One
driver serves one project and zone. A VM of :class:`~services.scheduler.drivers.base.InstanceSpec`
gets:

* machine type ``zones/{zone}/machineTypes/{type}``: a GCE type as named (``n1-standard-8``), or
  for the scheduler's ``local-{pool}-{cores}`` and ``job-private`` shapes the smallest n1 machine
  of the family with the cores (:func:`gce_machine_type`);
* a boot disk from ``HS_GCP_IMAGE`` (deleted with the VM), the network and subnetwork, no
  external address unless ``HS_GCP_EXTERNAL_IP`` (the VMs then need Cloud NAT to pull images);
* labels ``hailstream={deployment}``, ``inst_coll``, ``hailstream-region``, ``preemptible``;
* metadata ``startup-script``: the worker (:func:`.cloud.startup_script`);
* when preemptible, Spot scheduling that deletes the VM on preemption: the scheduler then finds
  its worker not answering and loses its attempts.

Idempotent by name: an insert answered 409 (the name exists) and a delete answered 404 do nothing.
``create`` waits for the zone operation of its insert, up to ``HS_CLOUD_CREATE_WAIT_S``, so a
quota or capacity error fails the create (the scheduler then records the instance deleted at
once instead of waiting out its activation timeout); past that wait it returns and the
activation timeout covers a VM that never comes. ``delete`` does not wait: the VM is going, and
a failed delete leaves a VM that :meth:`GcpDriver.list` still reports, so the scheduler deletes it
again. ``list`` returns this deployment's VMs (a label filter): ``PROVISIONING``, ``STAGING`` and
``RUNNING`` are ``running``, every other status (``STOPPING``, ``TERMINATED``, ``SUSPENDED``,
``REPAIRING``...) is ``stopped``; the address is the first internal IP and the worker port.

| variable | default | meaning |
|---|---|---|
| ``HS_GCP_PROJECT`` | required | the project of the VMs |
| ``HS_GCP_ZONE`` | required | their zone (``us-central1-a``) |
| ``HS_GCP_IMAGE`` | required | the boot image (``projects/P/global/images/family/F``) |
| ``HS_GCP_NETWORK`` | ``default`` | a network name or URL |
| ``HS_GCP_SUBNETWORK`` | none | a subnetwork name (in the zone's region) or URL |
| ``HS_GCP_SERVICE_ACCOUNT`` | none | the VMs' service account (scope ``cloud-platform``) |
| ``HS_GCP_DISK_GB`` | 20 | boot disk size |
| ``HS_GCP_EXTERNAL_IP`` | false | give each VM an ephemeral external address |
| ``HS_GCP_COMPUTE_ENDPOINT`` | Google's | the API endpoint (a fake: anonymous credentials) |

Plus the worker settings of :mod:`services.scheduler.drivers.cloud` (``HS_WORKER_IMAGE``...).
Credentials are Application Default Credentials unless an endpoint is set.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from typing import Self

import msgspec
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from core.resources import JOB_PRIVATE
from services.common.settings import Settings, parse_bool
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

# n1 machine sizes (cores) per family.
N1_SIZES = {"standard": (1, 2, 4, 8, 16, 32, 64, 96), "highcpu": (2, 4, 8, 16, 32, 64, 96),
            "highmem": (2, 4, 8, 16, 32, 64, 96)}
RUNNING_STATUSES = frozenset({"PROVISIONING", "STAGING", "RUNNING"})
_CALL_TIMEOUT_S = 30.0
_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


class GcpSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how the GCP driver creates VMs (module docstring)."""

    project: str
    zone: str
    image: str
    network: str = "default"
    subnetwork: str | None = None
    service_account: str | None = None
    disk_gb: int = 20
    external_ip: bool = False
    endpoint: str | None = None

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


def load_gcp_settings(env: Mapping[str, str] | None = None) -> GcpSettings:
    """The GCP settings from ``env`` (default: the process environment).

    Raises:
        ValueError: naming a required variable that is not set, or one that does not parse.
    """
    env = os.environ if env is None else env
    try:
        disk_gb = int(env.get("HS_GCP_DISK_GB") or 20)
        external_ip = parse_bool(env.get("HS_GCP_EXTERNAL_IP") or "false")
    except ValueError as e:
        raise ValueError(f"HS_GCP_DISK_GB / HS_GCP_EXTERNAL_IP: {e}") from None
    return GcpSettings(
        project=required(env, "HS_GCP_PROJECT", "gcp"), zone=required(env, "HS_GCP_ZONE", "gcp"),
        image=required(env, "HS_GCP_IMAGE", "gcp"), network=env.get("HS_GCP_NETWORK") or "default",
        subnetwork=env.get("HS_GCP_SUBNETWORK") or None,
        service_account=env.get("HS_GCP_SERVICE_ACCOUNT") or None, disk_gb=disk_gb,
        external_ip=external_ip, endpoint=env.get("HS_GCP_COMPUTE_ENDPOINT") or None)


def gce_machine_type(spec: InstanceSpec) -> str:
    """The GCE machine type of ``spec`` (module docstring); ValueError for an unknown shape."""
    if not (spec.machine_type.startswith("local-") or spec.machine_type == JOB_PRIVATE):
        return spec.machine_type
    found = shape(spec)
    if found is None:
        raise ValueError(f"no GCE machine type for {spec.machine_type!r}")
    family, cores = found
    return f"n1-{family}-{smallest(N1_SIZES[family], cores, f'n1-{family}')}"


class GcpDriver:
    """Instances as Compute Engine VMs; a :class:`ComputeDriver` and async context manager."""

    def __init__(self, gcp: GcpSettings, worker: CloudWorkerSettings) -> None:
        self._gcp = gcp
        self._worker = worker
        options = ClientOptions(api_endpoint=gcp.endpoint) if gcp.endpoint else None
        credentials = AnonymousCredentials() if gcp.endpoint else None  # type: ignore[no-untyped-call]
        self._instances = compute_v1.InstancesClient(
            credentials=credentials, client_options=options, transport="rest")
        # Our own operations client: the one InstancesClient keeps for its extended operations
        # ignores the endpoint override.
        self._operations = compute_v1.ZoneOperationsClient(
            credentials=credentials, client_options=options, transport="rest")
        self._closed = False

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> GcpDriver:
        """The driver the ``HS_GCP_*`` and cloud worker variables of ``env`` describe."""
        return cls(load_gcp_settings(env), load_cloud_worker_settings(settings, env))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def instance_resource(self, spec: InstanceSpec) -> compute_v1.Instance:
        """The VM that ``create`` inserts for ``spec``."""
        g = self._gcp
        network = g.network if "/" in g.network else (
            f"projects/{g.project}/global/networks/{g.network}")
        nic = compute_v1.NetworkInterface(network=network)
        if g.subnetwork:
            nic.subnetwork = g.subnetwork if "/" in g.subnetwork else (
                f"projects/{g.project}/regions/{g.region}/subnetworks/{g.subnetwork}")
        if g.external_ip:
            nic.access_configs = [compute_v1.AccessConfig(name="external-nat",
                                                          type_="ONE_TO_ONE_NAT")]
        instance = compute_v1.Instance(
            name=spec.name,
            machine_type=f"zones/{g.zone}/machineTypes/{gce_machine_type(spec)}",
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=g.image, disk_size_gb=g.disk_gb))],
            network_interfaces=[nic],
            labels=labels(self._worker, spec),
            metadata=compute_v1.Metadata(items=[compute_v1.Items(
                key="startup-script",
                value=startup_script(self._worker, spec, cloud="gcp"))]),
            scheduling=compute_v1.Scheduling(
                automatic_restart=False, on_host_maintenance="TERMINATE",
                provisioning_model="SPOT", instance_termination_action="DELETE")
            if spec.preemptible else compute_v1.Scheduling(
                automatic_restart=True, on_host_maintenance="MIGRATE",
                provisioning_model="STANDARD"))
        if g.service_account:
            instance.service_accounts = [compute_v1.ServiceAccount(email=g.service_account,
                                                                   scopes=_SCOPES)]
        return instance

    async def create(self, spec: InstanceSpec) -> None:
        if self._closed:
            raise RuntimeError("the gcp driver is closed")
        check_name(spec.name)
        instance = self.instance_resource(spec)
        try:
            operation = await asyncio.to_thread(
                self._instances.insert_unary, project=self._gcp.project, zone=self._gcp.zone,
                instance_resource=instance, timeout=_CALL_TIMEOUT_S)
        except api_exceptions.Conflict:
            log.info("instance %s exists already", spec.name)
            return
        log.info("instance %s: inserting (%s, operation %s)", spec.name,
                 instance.machine_type, operation.name)
        await asyncio.to_thread(self._wait, operation, spec.name)

    def _wait(self, operation: compute_v1.Operation, name: str) -> None:
        """Wait (bounded) for ``operation``; RuntimeError if it failed."""
        deadline = time.monotonic() + self._worker.create_wait_s
        while operation.status != compute_v1.Operation.Status.DONE:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("instance %s: insert not done after %.0fs, not waiting longer",
                            name, self._worker.create_wait_s)
                return
            # The wait call returns when the operation is done or after up to 2 minutes.
            operation = self._operations.wait(project=self._gcp.project, zone=self._gcp.zone,
                                              operation=operation.name,
                                              timeout=min(left, _CALL_TIMEOUT_S) + 5)
        errors = [f"{e.code}: {e.message}" for e in operation.error.errors]
        if errors:
            raise RuntimeError(f"inserting instance {name} failed: {'; '.join(errors)}")

    async def delete(self, name: str) -> None:
        try:
            operation = await asyncio.to_thread(
                self._instances.delete_unary, project=self._gcp.project, zone=self._gcp.zone,
                instance=name, timeout=_CALL_TIMEOUT_S)
        except api_exceptions.NotFound:
            return
        log.info("instance %s: deleting (operation %s)", name, operation.name)

    async def list(self) -> list[InstanceInfo]:
        request = compute_v1.ListInstancesRequest(
            project=self._gcp.project, zone=self._gcp.zone,
            filter=f"labels.hailstream={self._worker.deployment}")

        def fetch() -> list[compute_v1.Instance]:
            return list(self._instances.list(request=request, timeout=_CALL_TIMEOUT_S))

        return [self._info(i) for i in await asyncio.to_thread(fetch)
                if i.labels.get("hailstream") == self._worker.deployment]

    def _info(self, instance: compute_v1.Instance) -> InstanceInfo:
        state: InstanceState = "running" if instance.status in RUNNING_STATUSES else "stopped"
        ip = instance.network_interfaces[0].network_i_p if instance.network_interfaces else ""
        return InstanceInfo(name=instance.name, inst_coll=instance.labels.get("inst_coll", ""),
                            state=state, address=f"{ip}:{self._worker.port}" if ip else None)

    async def close(self) -> None:
        """Close the HTTP sessions (idempotent). VMs stay: they are the scheduler's state."""
        if self._closed:
            return
        self._closed = True
        self._instances.transport.close()  # type: ignore[no-untyped-call]
        self._operations.transport.close()  # type: ignore[no-untyped-call]
