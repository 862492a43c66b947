"""What the cloud drivers (GCP, Azure) share: the worker a VM starts, and machine shapes.

A cloud instance is a VM whose boot script starts ``python -m services.worker``, either in the
container image ``HS_WORKER_IMAGE`` (``docker run --network host``; the VM image needs Docker)
or, without an image, with ``HS_WORKER_PYTHON`` of a VM image that has hailstream installed.
The worker listens on ``0.0.0.0:HS_CLOUD_WORKER_PORT`` and announces the VM's first internal
address (``hostname -I``), so the scheduler reaches it over the private network. It gets:

* the log settings of the scheduler (``HS_KAFKA_*``, ``HS_TOPIC_PREFIX``): the bootstrap servers
  must be reachable from the VMs;
* the storage settings (``HS_STORAGE_URL``, ``HS_GCS_ENDPOINT``, ``HS_GCP_PROJECT``): without
  ``HS_STORAGE_URL`` a worker writes logs to its own disk, where ingest cannot read them;
* its identity: ``HS_WORKER_INSTANCE_NAME``, ``HS_WORKER_PORT``, ``HS_WORKER_CORES_MCPU``,
  ``HS_WORKER_REGION``, ``HS_WORKER_HOST=0.0.0.0``, ``HS_WORKER_ADVERTISE_HOST``;
* anything in ``HS_CLOUD_WORKER_ENV`` (a JSON object, e.g. ``{"HS_WORKER_HEARTBEAT_S": "60"}``).

| variable | default | meaning |
|---|---|---|
| ``HS_WORKER_IMAGE`` | none | the image the worker runs in (this repository's Dockerfile) |
| ``HS_WORKER_PYTHON`` | ``python3`` | without an image: a Python that has hailstream |
| ``HS_CLOUD_WORKER_PORT`` | 5001 | the worker's port on every VM |
| ``HS_CLOUD_WORKER_ENV`` | ``{}`` | more variables for every worker (JSON object) |
| ``HS_CLOUD_DEPLOYMENT`` | ``hailstream`` | the ``hailstream`` label/tag of this deployment's VMs |
| ``HS_CLOUD_CREATE_WAIT_S`` | 60 | how long ``create`` waits for the cloud's operation |

A driver lists (and so manages) only the VMs labelled with its deployment.

Machine shapes: the scheduler names pool machines ``local-{pool}-{cores}``
(``local-highmem-np-16``) and job-private ones ``job-private`` (sized by the job's cores) or
by a GCE type (``n1-standard-8``). :func:`shape` reads a family (``standard``, ``highcpu``,
``highmem``) and a core count from any of these; each driver maps that to its cloud's sizes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence

import msgspec

from core.resources import JOB_PRIVATE
from services.common.settings import Settings, log_env
from services.common.storage import load_storage_settings, storage_env
from services.scheduler.drivers.base import InstanceSpec

FAMILIES = ("standard", "highcpu", "highmem")
_LOCAL = re.compile(r"^local-(?P<family>standard|highcpu|highmem)(?:-np)?-(?P<cores>\d+)$")
_GCE = re.compile(r"^[a-z][a-z0-9]*-(?P<family>standard|highcpu|highmem)-(?P<cores>\d+)$")
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class CloudWorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How every cloud VM starts its worker (module docstring)."""

    image: str | None = None
    python: str = "python3"
    port: int = 5001
    deployment: str = "hailstream"
    create_wait_s: float = 60.0
    # The environment every worker gets before its identity: log, storage, HS_CLOUD_WORKER_ENV.
    env: dict[str, str] = {}


def required(env: Mapping[str, str], var: str, driver: str) -> str:
    """``env[var]``, or a ValueError that names the variable."""
    value = env.get(var, "").strip()
    if not value:
        raise ValueError(f"{var} is not set: the {driver} compute driver needs it "
                         f"(see services/scheduler/drivers/{driver}.py)")
    return value


def load_cloud_worker_settings(settings: Settings, env: Mapping[str, str] | None = None
                               ) -> CloudWorkerSettings:
    """The worker settings of cloud VMs from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    try:
        extra = json.loads(env.get("HS_CLOUD_WORKER_ENV") or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"HS_CLOUD_WORKER_ENV: not JSON: {e}") from None
    if not isinstance(extra, dict) or not all(isinstance(v, str) for v in extra.values()):
        raise ValueError("HS_CLOUD_WORKER_ENV: expected a JSON object of strings")
    deployment = env.get("HS_CLOUD_DEPLOYMENT") or "hailstream"
    if not _LABEL.match(deployment):
        raise ValueError(f"HS_CLOUD_DEPLOYMENT: {deployment!r} is not a valid label value "
                         f"({_LABEL.pattern})")
    try:
        port = int(env.get("HS_CLOUD_WORKER_PORT") or 5001)
        wait_s = float(env.get("HS_CLOUD_CREATE_WAIT_S") or 60)
    except ValueError as e:
        raise ValueError(f"HS_CLOUD_WORKER_PORT / HS_CLOUD_CREATE_WAIT_S: {e}") from None
    worker_env = {**log_env(settings.log), **storage_env(load_storage_settings(env)), **extra}
    return CloudWorkerSettings(image=env.get("HS_WORKER_IMAGE") or None,
                               python=env.get("HS_WORKER_PYTHON") or "python3", port=port,
                               deployment=deployment, create_wait_s=wait_s, env=worker_env)


def worker_env(worker: CloudWorkerSettings, spec: InstanceSpec) -> dict[str, str]:
    """The variables of the worker of ``spec`` (but its advertised host, known on the VM)."""
    return {**worker.env, "HS_WORKER_INSTANCE_NAME": spec.name,
            "HS_WORKER_PORT": str(worker.port), "HS_WORKER_CORES_MCPU": str(spec.cores_mcpu),
            "HS_WORKER_REGION": spec.region, "HS_WORKER_HOST": "0.0.0.0"}


def startup_script(worker: CloudWorkerSettings, spec: InstanceSpec, *, cloud: str) -> str:
    """The boot script of the VM of ``spec``: it runs the worker in the foreground."""
    env = worker_env(worker, spec)
    lines = ["#!/bin/bash",
             f"# hailstream worker {spec.name} ({spec.inst_coll}), created by the {cloud} driver",
             "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines += ["HS_WORKER_ADVERTISE_HOST=\"$(hostname -I | awk '{print $1}')\"",
              "export HS_WORKER_ADVERTISE_HOST"]
    if worker.image:
        names = [*sorted(env), "HS_WORKER_ADVERTISE_HOST"]
        cmd = ["docker", "run", "--rm", "--name", "hailstream-worker", "--network", "host",
               *[a for k in names for a in ("-e", k)], worker.image,
               "python", "-m", "services.worker"]
    else:
        cmd = [worker.python, "-m", "services.worker"]
    lines.append("exec " + " ".join(shlex.quote(a) for a in cmd))
    return "\n".join(lines) + "\n"


def shape(spec: InstanceSpec) -> tuple[str, int] | None:
    """``(family, cores)`` of the machine ``spec`` asks for, None when it names no shape."""
    if spec.machine_type == JOB_PRIVATE:
        return "standard", max(1, -(-spec.cores_mcpu // 1000))
    match = _LOCAL.match(spec.machine_type) or _GCE.match(spec.machine_type)
    if match is None:
        return None
    return match.group("family"), int(match.group("cores"))


def smallest(sizes: Sequence[int], cores: int, what: str) -> int:
    """The smallest of ``sizes`` (increasing) with at least ``cores``; ValueError if none."""
    for size in sizes:
        if size >= cores:
            return size
    raise ValueError(f"no {what} machine has {cores} cores (the largest has {sizes[-1]})")


def labels(worker: CloudWorkerSettings, spec: InstanceSpec) -> dict[str, str]:
    """The labels (GCP) or tags (Azure) of the VM of ``spec``."""
    return {"hailstream": worker.deployment, "inst_coll": spec.inst_coll,
            "hailstream-region": _label_value(spec.region),
            "preemptible": "true" if spec.preemptible else "false"}


def _label_value(value: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]
