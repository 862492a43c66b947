"""Compute drivers behind one interface, chosen by one factory (STYLE habit 6).

``local`` (worker processes on this machine) is the default; ``gcp`` and ``azure`` come later
behind the same :class:`ComputeDriver` interface.
"""

from __future__ import annotations

from services.common.settings import Settings
from services.scheduler.drivers.base import (
    ComputeDriver,
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    check_name,
)

__all__ = ["DRIVER_KINDS", "ComputeDriver", "InstanceInfo", "InstanceSpec", "InstanceState",
           "check_name", "create_driver"]

DRIVER_KINDS = ("local", "gcp", "azure")

# Where the cloud drivers are planned (the issue that adds each one).
_PLANNED = {
    "gcp": "GCP driver (google-cloud-compute): planned in issue 7 (operations: cloud drivers)",
    "azure": "Azure driver (azure-mgmt-compute): planned in issue 7 (operations: cloud drivers)",
}


def create_driver(kind: str, settings: Settings) -> ComputeDriver:
    """The compute driver named ``kind`` (``local``, ``gcp`` or ``azure``) for ``settings``.

    Raises:
        NotImplementedError: for a cloud driver that is not implemented yet.
        ValueError: for an unknown kind.
    """
    if kind == "local":
        from services.scheduler.drivers.local import LocalDriver

        return LocalDriver(settings)
    if kind in _PLANNED:
        raise NotImplementedError(f"compute driver {kind!r} is not implemented yet: "
                                  f"{_PLANNED[kind]}; use 'local'")
    raise ValueError(f"unknown compute driver {kind!r}: expected one of {', '.join(DRIVER_KINDS)}")
