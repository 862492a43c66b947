"""Compute drivers behind one interface, chosen by one factory (STYLE habit 6).

``local`` (worker processes on this machine) is the default; ``gcp`` (Compute Engine VMs,
:mod:`.gcp`) and ``azure`` (Azure VMs, :mod:`.azure`) read their own ``HS_GCP_*`` /
``HS_AZURE_*`` variables and the cloud worker settings of :mod:`.cloud`.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def create_driver(kind: str, settings: Settings, env: Mapping[str, str] | None = None
                  ) -> ComputeDriver:
    """The compute driver named ``kind`` (``local``, ``gcp`` or ``azure``) for ``settings``.

    The cloud drivers read their settings from ``env`` (default: the process environment).

    Raises:
        ValueError: for an unknown kind, or a cloud setting that is missing (naming the
            variable) or malformed.
    """
    if kind == "local":
        from services.scheduler.drivers.local import LocalDriver

        return LocalDriver(settings)
    if kind == "gcp":
        from services.scheduler.drivers.gcp import GcpDriver

        return GcpDriver.from_env(settings, env)
    if kind == "azure":
        from services.scheduler.drivers.azure import AzureDriver

        return AzureDriver.from_env(settings, env)
    raise ValueError(f"unknown compute driver {kind!r}: expected one of {', '.join(DRIVER_KINDS)}")
