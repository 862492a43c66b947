"""Why ready jobs wait: the reasons a scheduling step reports and the changes a leader publishes.

A scheduling step (:func:`core.scheduling.schedule`) reports a :class:`Waiting` for every
(user, inst_coll) queue that got fewer placements than it has ready jobs, and for the first few
blocked jobs of a queue (:data:`MAX_JOBS_PER_QUEUE`) whose reason is their own (their regions,
their size). It costs nothing per job beyond what the step examines anyway.

Reason codes (documented for users in ``docs/job-lifecycle.md``):

- ``quota``: the priority policy's quotas (max active cores, max cost or core time in 24 h);
- ``fair_share``: the user's share of the free cores is used up; other users hold the rest;
- ``no_fit``: no active instance has the cores free (waiting on the autoscaler, or the
  collection is at its maximum number of instances);
- ``region``: no instance of the collection is in one of the job's regions;
- ``queued``: the step reached its limit of examined jobs before this queue (next round);
- ``cancelled``: the job is cancelled and waits to be drained. The scheduler does not publish
  it: reads derive it from the cancellation facts already projected.

The leader publishes only changes (:func:`changes_event`), at most :data:`MAX_ENTRIES_PER_EVENT`
per event; what it published is a fold of its own events (:func:`apply_published`), so the next
diff is against exactly what consumers were told.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from core.policy import REASON_FAIR_SHARE, REASON_NO_FIT, REASON_NO_INSTANCES, REASON_REGION
from schemas.control import WaitingReason, WaitingReasonsChanged

QUOTA: Final = "quota"
FAIR_SHARE: Final = "fair_share"
NO_FIT: Final = "no_fit"
REGION: Final = "region"
QUEUED: Final = "queued"
CANCELLED: Final = "cancelled"
POLICY: Final = "policy"
"""A predicate of a caller's tier that is none of the above (its own text is the message)."""
CODES: Final = (QUOTA, FAIR_SHARE, NO_FIT, REGION, QUEUED, CANCELLED, POLICY)

MAX_JOBS_PER_QUEUE: Final = 3
"""Job-specific entries per (user, inst_coll) queue in one step; later jobs read the queue's."""
MAX_ENTRIES_PER_EVENT: Final = 500
"""Changes per published event; the rest follow in the next events."""
MAX_MESSAGE: Final = 500
"""Characters of a message (longer ones are cut)."""


class WaitingKey(NamedTuple):
    """A queue's entry (``batch_id`` and ``job_id`` None) or one job's."""

    user: str
    inst_coll: str
    batch_id: int | None = None
    job_id: int | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """A reason code and a human-readable message that only changes when the situation does."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Published:
    """What consumers were told about one entry, and since when."""

    waiting: Waiting
    since_ms: int


def _sort_key(key: WaitingKey) -> tuple[str, str, int, int, int]:
    job = key.batch_id is not None
    return (key.user, key.inst_coll, int(job), key.batch_id or 0, key.job_id or 0)


def capacity_note(at_max_instances: int | None) -> str:
    """What a job short of free cores waits for.

    Args:
        at_max_instances: The collection's maximum number of instances when it has reached it,
            else None.

    Returns:
        ``"waiting for the autoscaler"`` or the maximum reached.

    """
    if at_max_instances is None:
        return "waiting for the autoscaler"
    return f"the collection is at its maximum of {at_max_instances} instances"


def classify(reasons: tuple[str, ...], *, inst_coll: str, cores_mcpu: int,
             regions: Collection[str], note: str) -> Waiting:
    """The waiting reason of a job that no instance took, from the predicates' reasons.

    Args:
        reasons: The distinct reasons of :meth:`core.policy.Tiers.place`, in the order seen.
        inst_coll: The job's instance collection.
        cores_mcpu: The job's cores.
        regions: The job's allowed regions (empty: any).
        note: :func:`capacity_note` of the collection.

    Returns:
        ``quota``, ``fair_share`` or ``policy`` when a user-level predicate refused it (they
        refuse every instance alike); ``no_fit`` when some instance was in its regions but
        short of cores (or there were no instances); ``region`` when every instance was
        outside its regions.

    """
    first = reasons[0] if reasons else REASON_NO_INSTANCES
    if first.startswith("quota"):
        return Waiting(QUOTA, _cut(f"{first}: the user's jobs wait until usage falls below it"))
    if first == REASON_FAIR_SHARE:
        return Waiting(FAIR_SHARE, f"fair share: the user's share of the free {inst_coll} "
                                   "cores is used up; other users hold the rest")
    if first == REASON_NO_INSTANCES:
        return full(inst_coll, note)
    if REASON_NO_FIT in reasons:
        return Waiting(NO_FIT, f"needs {cores_mcpu} mCPU; no active {inst_coll} instance has "
                               f"that free; {note}")
    if reasons == (REASON_REGION,):
        return Waiting(REGION, _cut(f"no active {inst_coll} instance in the job's regions "
                                    f"({', '.join(sorted(regions))}); {note}"))
    return Waiting(POLICY, _cut(first))


def full(inst_coll: str, note: str) -> Waiting:
    """Every active instance of the collection was full before the queue's turn came.

    The same words as when the step found no instance with free cores at all (the next
    round's view of a full collection), so a full collection does not flip the message.

    Args:
        inst_coll: The collection.
        note: :func:`capacity_note` of the collection.

    Returns:
        A ``no_fit`` reason.

    """
    return Waiting(NO_FIT, f"no active {inst_coll} instance has free cores; {note}")


def queued(max_jobs: int) -> Waiting:
    """The step examined its maximum of jobs before the queue's turn (or the rest of it) came.

    Args:
        max_jobs: The step's limit.

    Returns:
        A ``queued`` reason.

    """
    return Waiting(QUEUED, f"waiting its turn: the scheduler examines at most {max_jobs} "
                           "jobs per round")


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "..."


def changes(published: Mapping[WaitingKey, Published], current: Mapping[WaitingKey, Waiting],
            *, limit: int = MAX_ENTRIES_PER_EVENT) -> list[tuple[WaitingKey, Waiting | None]]:
    """What differs between what consumers were told and the latest step, in key order.

    Args:
        published: What consumers were told (:func:`apply_published`).
        current: The latest step's reasons.
        limit: At most this many changes (the rest stay different, for the next call).

    Returns:
        ``(key, waiting)`` for new or changed entries and ``(key, None)`` for cleared ones,
        queue entries of a user before its job entries.

    """
    out: list[tuple[WaitingKey, Waiting | None]] = []
    gone = [k for k in published if k not in current]
    moved = [k for k, w in current.items()
             if (p := published.get(k)) is None or p.waiting != w]
    for key in sorted((*gone, *moved), key=_sort_key)[:max(limit, 0)]:
        out.append((key, current.get(key)))
    return out


def changes_event(published: Mapping[WaitingKey, Published],
                  current: Mapping[WaitingKey, Waiting], *, epoch: int, now_ms: int,
                  first: bool = False, limit: int = MAX_ENTRIES_PER_EVENT
                  ) -> WaitingReasonsChanged | None:
    """The event that tells consumers what changed, or None when nothing did.

    Args:
        published: What consumers were told in this epoch (empty for a new leader).
        current: The latest step's reasons.
        epoch: The leader's epoch.
        now_ms: The time to record for reasons that are new (a changed message of the same
            reason keeps its time).
        first: The epoch's first event, sent even when empty: it makes consumers drop what
            earlier epochs said.
        limit: Changes per event.

    Returns:
        A ``scheduler.waiting_reasons`` event, or None.

    """
    diff = changes(published, current, limit=limit)
    if not diff and not first:
        return None
    entries = []
    for key, waiting in diff:
        if waiting is None:
            entries.append(WaitingReason(user=key.user, inst_coll=key.inst_coll,
                                         batch_id=key.batch_id, job_id=key.job_id))
            continue
        before = published.get(key)
        since = before.since_ms if before is not None and (
            before.waiting.reason == waiting.reason) else now_ms
        entries.append(WaitingReason(user=key.user, inst_coll=key.inst_coll,
                                     batch_id=key.batch_id, job_id=key.job_id,
                                     reason=waiting.reason, message=waiting.message,
                                     since_ms=since))
    return WaitingReasonsChanged(epoch=epoch, entries=entries)


def apply_published(published: MutableMapping[WaitingKey, Published],
                    event: WaitingReasonsChanged, time_ms: int) -> None:
    """Fold an event into what consumers were told (in place), as a consumer folds it.

    Args:
        published: What consumers were told so far in the event's epoch.
        event: The event.
        time_ms: The envelope's time (for entries without ``since_ms``).

    """
    for e in event.entries:
        key = WaitingKey(e.user, e.inst_coll, e.batch_id, e.job_id)
        if e.reason is None:
            published.pop(key, None)
        else:
            published[key] = Published(Waiting(e.reason, e.message),
                                       time_ms if e.since_ms is None else e.since_ms)
