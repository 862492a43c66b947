"""What a scheduler replica knows: the folded state plus what only the service needs."""

from __future__ import annotations

import asyncio

from core.scheduler_state import SchedulerState
from schemas.envelope import Envelope
from schemas.infra import InstanceActivated, InstanceDeleted
from services.common.log import Record


class View:
    """What a replica knows: the folded state plus what only the service needs (addresses)."""

    def __init__(self) -> None:
        self.state = SchedulerState()
        self.addresses: dict[str, str] = {}
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
            case InstanceDeleted() as e:
                self.addresses.pop(e.instance_name, None)
            case _:
                pass

    def reached(self, marks: dict[tuple[str, int], int]) -> bool:
        """Whether every partition has been folded up to its mark."""
        return all(self.positions.get(tp, 0) >= end for tp, end in marks.items())
