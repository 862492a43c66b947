"""What a scheduler replica knows: the folded state plus what only the service needs."""

from __future__ import annotations

import asyncio

from core.billing import Machine, fold_version, machine_of
from core.scheduler_state import SchedulerState
from schemas.control import ResourceRateSet
from schemas.envelope import Envelope
from schemas.infra import InstanceActivated, InstanceDeleted, InstanceRequested
from services.common.log import Record


class View:
    """What a replica knows: the folded state plus what only the service needs (addresses)."""

    def __init__(self) -> None:
        self.state = SchedulerState()
        self.addresses: dict[str, str] = {}
        self.machines: dict[str, Machine] = {}
        """What each instance is, as billing sees it."""
        self.latest_versions: dict[str, str] = {}
        """The latest version of each billed product (new attempts are billed at it)."""
        self.positions: dict[tuple[str, int], int] = {}
        """The next offset to fold, per (logical topic, partition)."""
        self.changed = asyncio.Event()

    def fold(self, records: list[Record]) -> None:
        for rec in records:
            self.apply_local(rec.envelope)
            self.positions[(rec.topic, rec.partition)] = rec.offset + 1
        if records:
            self.changed.set()

    def apply_local(self, env: Envelope) -> None:
        """Fold one envelope (from the log, or just published by this replica)."""
        self.state.apply(env)
        match env.event:
            case InstanceActivated() as e:
                self.addresses[e.instance_name] = e.address
            case InstanceRequested() as e:
                self.machines[e.instance_name] = machine_of(e.inst_coll, e.machine_type,
                                                            e.preemptible, e.cores_mcpu)
            case InstanceDeleted() as e:
                self.addresses.pop(e.instance_name, None)
                self.machines.pop(e.instance_name, None)
            case ResourceRateSet() as e:
                fold_version(self.latest_versions, e.resource)
            case _:
                pass

    def reached(self, marks: dict[tuple[str, int], int]) -> bool:
        """Whether every partition has been folded up to its mark."""
        return all(self.positions.get(tp, 0) >= end for tp, end in marks.items())
