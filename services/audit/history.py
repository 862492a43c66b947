"""The event history of one batch, or of one job, read from the log.

A batch's events share its key (the batch id), so they sit in one partition of the batch topic,
in order; :func:`load_batch` scans that partition (and the batch's partition of the completions
topic) and keeps the records with the batch's key. The rest is pure: :func:`job_history` picks
the events that concern one job, :func:`format_line` and :func:`to_json` render an entry.

A job's history is: its own execution events (``job_id``; a bunch of SJs shows the job's attempts
only), the bunch that submitted it (showing that job only), its update's opening and commit, the
job groups it belongs to (its group and every ancestor: submission, cancellation, completion) and
the batch-wide events (creation, cancellation, deletion, completion).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec

from schemas import codec
from schemas import topics as logical_topics
from schemas.batch import (
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupCancelRequested,
    JobGroupCompleted,
    JobGroupsSubmitted,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.envelope import Envelope
from schemas.execution import JobsCancelled, JobsCompleted, JobsScheduled
from services.audit.logread import PartitionReader, partition_for
from services.common.log import high_watermarks
from services.common.settings import LogSettings

HISTORY_TOPICS = (logical_topics.BATCH, logical_topics.COMPLETIONS)
_BATCH_WIDE = (BatchCreated, BatchCancelRequested, BatchCancelled, BatchDeleted, BatchCompleted)
_GROUP_EVENTS = (JobGroupCancelRequested, JobGroupCancelled, JobGroupCompleted)
_MAX_TEXT = 60
_json = msgspec.json.Encoder(decimal_format="string")


class Entry(NamedTuple):
    """An envelope with where it was read from (logical topic)."""

    topic: str
    partition: int
    offset: int
    envelope: Envelope


def interleave(primary: Sequence[Entry], secondary: Sequence[Entry]) -> list[Entry]:
    """Merge two logs of one batch, keeping each one's order; ties go to ``primary``.

    The order within a partition is the truth; times only place one log's entries among the
    other's (completions are appended after the events that caused them).
    """
    out: list[Entry] = []
    i = j = 0
    while i < len(primary) and j < len(secondary):
        if secondary[j].envelope.time_ms < primary[i].envelope.time_ms:
            out.append(secondary[j])
            j += 1
        else:
            out.append(primary[i])
            i += 1
    return out + list(primary[i:]) + list(secondary[j:])


def _ancestors(groups: dict[int, int], group: int) -> set[int]:
    out = {group}
    while group in groups and groups[group] not in out:
        group = groups[group]
        out.add(group)
    return out | {0}


def job_history(entries: Sequence[Entry], job_id: int) -> list[Entry] | None:
    """The entries of a batch that concern job ``job_id``; None if no bunch submitted it.

    Bunches are narrowed to the job's record, and group submissions to the job's groups.
    """
    parents: dict[int, int] = {}
    record, update_id = None, None
    for e in entries:
        event = e.envelope.event
        if isinstance(event, JobGroupsSubmitted):
            parents.update({g.job_group_id: g.parent_id for g in event.job_groups})
        elif isinstance(event, JobsSubmitted) and record is None:
            record = next((j for j in event.jobs if j.job_id == job_id), None)
            update_id = event.update_id
    if record is None:
        return None
    groups = _ancestors(parents, record.job_group_id)
    out: list[Entry] = []
    for e in entries:
        event = e.envelope.event
        narrowed: Any = None
        if isinstance(event, JobsSubmitted):
            jobs = [j for j in event.jobs if j.job_id == job_id]
            narrowed = msgspec.structs.replace(event, jobs=jobs) if jobs else None
        elif isinstance(event, JobGroupsSubmitted):
            mine = [g for g in event.job_groups if g.job_group_id in groups]
            narrowed = msgspec.structs.replace(event, job_groups=mine) if mine else None
        elif isinstance(event, JobsScheduled | JobsCompleted):
            attempts = [a for a in event.attempts if a.job_id == job_id]
            narrowed = msgspec.structs.replace(event, attempts=attempts) if attempts else None
        elif isinstance(event, JobsCancelled):
            narrowed = (msgspec.structs.replace(event, job_ids=[job_id])
                        if job_id in event.job_ids else None)
        elif _concerns(event, job_id, update_id, groups):
            narrowed = event
        if narrowed is not None:
            out.append(e if narrowed is event else e._replace(
                envelope=msgspec.structs.replace(e.envelope, event=narrowed)))
    return out


def _concerns(event: Any, job_id: int, update_id: int | None, groups: set[int]) -> bool:
    if isinstance(event, UpdateOpened | UpdateCommitted):
        return event.update_id == update_id
    if isinstance(event, _GROUP_EVENTS):
        return event.job_group_id in groups
    return isinstance(event, _BATCH_WIDE) or getattr(event, "job_id", None) == job_id


def _is_default(field: msgspec.structs.FieldInfo, value: Any) -> bool:
    if field.default is not msgspec.NODEFAULT:
        return bool(value == field.default)
    if field.default_factory is not msgspec.NODEFAULT:
        return bool(value == field.default_factory())
    return False


def id_ranges(ids: Sequence[int]) -> str:
    """Ids as compact ranges: ``[1, 2, 3, 7]`` is ``1..3,7``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(ids)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
    return ",".join(out)


def _text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, msgspec.Struct | dict | list):
        text = _json.encode(value).decode()
    else:
        text = str(value)
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT - 1] + "…"


def summary(event: Any) -> str:
    """The key fields of an event as ``name=value`` pairs (defaults and the batch id left out).

    Bunches show their ids as ranges; other lists show their length; long text is truncated.
    """
    parts: list[str] = []
    if isinstance(event, JobsSubmitted):
        ids = [j.job_id for j in event.jobs]
        parts.append(f"jobs={id_ranges(ids)} (n={len(ids)})")
        if len(event.jobs) == 1:
            j = event.jobs[0]
            parts += [f"group={j.job_group_id}", f"inst_coll={j.inst_coll}",
                      f"cores_mcpu={j.resources.cores_mcpu}"]
            if j.parent_ids:
                parts.append(f"parents={id_ranges(j.parent_ids)}")
    elif isinstance(event, JobGroupsSubmitted):
        parts.append(f"groups={id_ranges([g.job_group_id for g in event.job_groups])}")
    elif isinstance(event, JobsScheduled | JobsCompleted):
        ids = [a.job_id for a in event.attempts]
        parts.append(f"jobs={id_ranges(ids)} (n={len(ids)})")
        if len(event.attempts) == 1:  # the attempt's own fields, as its single event shows them
            single = event.expand()[0]
            parts += [p for p in summary(single).split(" ") if not p.startswith("job_id=")]
    elif isinstance(event, JobsCancelled):
        parts.append(f"jobs={id_ranges(event.job_ids)} (n={len(event.job_ids)})")
    for field in msgspec.structs.fields(event):
        name = field.name
        if name in ("batch_id", "jobs", "job_groups", "attempts", "job_ids"):
            continue
        value = getattr(event, name)
        if _is_default(field, value):
            continue
        if isinstance(value, list) and value and isinstance(value[0], msgspec.Struct):
            parts.append(f"{name}=[{len(value)}]")
        else:
            parts.append(f"{name}={_text(value)}")
    return " ".join(parts)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def format_line(entry: Entry) -> str:
    """One readable line: position, time (UTC), tag and the event's key fields."""
    env = entry.envelope
    where = f"{entry.topic}[{entry.partition}]@{entry.offset}"
    epoch = f" epoch={env.producer_epoch}" if env.producer_epoch else ""
    return f"{where:<22} {_time(env.time_ms)}  {env.tag:<28} {summary(env.event)}{epoch}"


def to_json(entry: Entry) -> str:
    """One JSON line: the position and the whole envelope (as the JSON codec writes it)."""
    position = {"topic": entry.topic, "partition": entry.partition, "offset": entry.offset}
    envelope = msgspec.json.decode(codec.encode_json(entry.envelope))
    return _json.encode({**position, **envelope}).decode()


async def load_batch(settings: LogSettings, batch_id: int) -> list[Entry]:
    """Every event of ``batch_id`` on the batch and completions topics, in log order."""
    key = str(batch_id).encode()
    marks = await high_watermarks(settings, HISTORY_TOPICS)
    found: dict[str, list[Entry]] = {t: [] for t in HISTORY_TOPICS}
    async with PartitionReader(settings) as reader:
        for topic in HISTORY_TOPICS:
            parts = await reader.partitions(topic)
            if not parts:
                continue
            partition = parts[partition_for(key, len(parts))]
            end = marks.get((topic, partition), 0)
            async for records in reader.read(topic, partition, 0, end):
                for m in records:
                    if m.key != key:
                        continue
                    env = codec.decode(m.value)
                    if getattr(env.event, "batch_id", None) == batch_id:
                        found[topic].append(Entry(topic, partition, m.offset, env))
    return interleave(found[logical_topics.BATCH], found[logical_topics.COMPLETIONS])


def render(entries: Sequence[Entry], *, as_json: bool) -> Iterator[str]:
    """The lines to print for ``entries``."""
    for e in entries:
        yield to_json(e) if as_json else format_line(e)
