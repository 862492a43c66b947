"""The behaviour every compute driver shares (the local driver's tests check the same on
processes): idempotent create and delete by name, list, close."""

from __future__ import annotations

import pytest

from services.scheduler.drivers import ComputeDriver, InstanceSpec


def contract_spec(name: str, preemptible: bool = False) -> InstanceSpec:
    return InstanceSpec(name=name, inst_coll="standard", machine_type="local-standard-16",
                        cores_mcpu=16_000, region="us-central1", preemptible=preemptible)


async def check_driver_contract(driver: ComputeDriver) -> None:
    """Run the shared contract against ``driver``, which must start with no instances."""
    assert await driver.list() == []
    await driver.create(contract_spec("w-1"))
    await driver.create(contract_spec("w-1"))  # idempotent by name
    (info,) = await driver.list()
    assert (info.name, info.inst_coll, info.state) == ("w-1", "standard", "running")
    await driver.create(contract_spec("w-2", preemptible=True))
    assert sorted(i.name for i in await driver.list()) == ["w-1", "w-2"]
    await driver.delete("w-1")
    await driver.delete("w-1")  # idempotent
    await driver.delete("never-created")
    assert [i.name for i in await driver.list()] == ["w-2"]
    await driver.delete("w-2")
    assert await driver.list() == []
    with pytest.raises(ValueError, match="invalid instance name"):
        await driver.create(contract_spec("W 1"))
    await driver.close()
    await driver.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await driver.create(contract_spec("w-3"))
