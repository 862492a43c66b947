"""Rates: defaults set once, edits as new versions, and the scheduler billing at the latest."""

from __future__ import annotations

from decimal import Decimal

import pytest
import typer

from core.billing import default_rates
from schemas.control import ResourceRateSet
from schemas.envelope import wrap
from schemas.infra import InstanceDeleted, InstanceRequested
from services.ingest.admin import missing_default_rates, next_rate
from services.scheduler.view import View


def test_default_rates_are_set_once() -> None:
    events = missing_default_rates({})
    assert {e.resource: e.rate for e in events} == default_rates()
    known = {e.resource: e.rate for e in events[:3]}
    assert {e.resource for e in missing_default_rates(known)} == set(default_rates()) - set(known)
    assert missing_default_rates(default_rates()) == []


def test_a_new_rate_is_a_new_version() -> None:
    known = {"compute/standard-preemptible/1": Decimal(1),
             "compute/standard-preemptible/2": Decimal(2), "memory/x/1": Decimal(3)}
    event = next_rate(known, "compute/standard-preemptible", Decimal("0.5"))
    assert event == ResourceRateSet(resource="compute/standard-preemptible/3",
                                    rate=Decimal("0.5"))
    assert next_rate(known, "compute/new", Decimal(1)).resource == "compute/new/1"
    with pytest.raises(typer.BadParameter):
        next_rate({"odd/v-beta": Decimal(1)}, "odd", Decimal(1))


def test_the_scheduler_view_bills_new_attempts_at_the_latest_version() -> None:
    view = View()
    for i, event in enumerate([
            InstanceRequested(instance_name="w1", inst_coll="highmem-np",
                              machine_type="local-highmem-np-16", region="local",
                              cores_mcpu=16_000, preemptible=False),
            ResourceRateSet(resource="compute/highmem-nonpreemptible/1", rate=Decimal(1)),
            ResourceRateSet(resource="compute/highmem-nonpreemptible/2", rate=Decimal(2)),
            ResourceRateSet(resource="compute/highmem-nonpreemptible/1", rate=Decimal(1))]):
        view.apply_local(wrap(event, event_id=str(i), time_ms=i))
    machine = view.machines["w1"]
    assert (machine.worker_type, machine.preemptible, machine.worker_cores_mcpu) == (
        "highmem", False, 16_000)
    assert view.latest_versions == {"compute/highmem-nonpreemptible": "2"}
    view.apply_local(wrap(InstanceDeleted(instance_name="w1", reason="idle"), event_id="x",
                          time_ms=9))
    assert "w1" not in view.machines
