"""Logical topic names. Each event class names its topic; the broker-side name may be prefixed."""

from typing import Final

BATCH: Final = "batch-events"
"""Everything about one batch, keyed by batch id: submission, SJ/MJS/MJC, cancellation."""
CONTROL: Final = "control-events"
"""Users, tokens, billing projects, memberships, limits, resource rates; keyed by the entity."""
SCHEDULER: Final = "scheduler-events"
"""Scheduler elections and instance lifecycle; keyed by instance name (or 'scheduler')."""
COMPLETIONS: Final = "completions"
"""BatchCompleted and JobGroupCompleted for downstream consumers; keyed by batch id."""

ALL: Final = (BATCH, CONTROL, SCHEDULER, COMPLETIONS)
