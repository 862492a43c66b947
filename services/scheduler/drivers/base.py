"""The one interface every compute driver implements (local processes, GCP, Azure).

A driver creates, deletes and lists *instances*: the machines the scheduler runs workers on. Every
call is idempotent by the instance name (invariant 7): creating a name that exists, or deleting
one that does not, does nothing, so the scheduler may repeat any call after a crash or a timeout.
Which driver runs is chosen in one place, :func:`services.scheduler.drivers.create_driver`.
"""

from __future__ import annotations

import re
from typing import Literal, Protocol

import msgspec

InstanceState = Literal["running", "stopped"]

# Instance names become process titles, file names and cloud resource names: keep them to the
# intersection of what GCP and Azure accept (lower-case letters, digits, hyphens).
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


class InstanceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What the autoscaler asks a driver for: one instance of an instance collection."""

    name: str
    inst_coll: str
    machine_type: str
    cores_mcpu: int
    region: str
    preemptible: bool = False


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a driver knows about one of its instances."""

    name: str
    inst_coll: str
    state: InstanceState
    address: str | None = None  # host:port of its worker, once known


class ComputeDriver(Protocol):
    """Creates, deletes and lists instances; every call is idempotent by instance name."""

    async def create(self, spec: InstanceSpec) -> None:
        """Start the instance ``spec.name``; a no-op if an instance of that name exists."""
        ...

    async def delete(self, name: str) -> None:
        """Delete the instance ``name``; a no-op if there is none."""
        ...

    async def list(self) -> list[InstanceInfo]:
        """The instances of this driver, with their current state."""
        ...

    async def close(self) -> None:
        """Release the driver's resources (idempotent)."""
        ...


def check_name(name: str) -> str:
    """``name`` if it is a valid instance name, else ValueError."""
    if not _NAME.match(name):
        raise ValueError(f"invalid instance name {name!r}: expected {_NAME.pattern}")
    return name
