"""Builders of event streams and database snapshots for projector tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from schemas.base import JobResources
from schemas.batch import (
    BatchCreated,
    JobGroupRecord,
    JobGroupsSubmitted,
    JobRecord,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from services.common.log import Record
from services.common.settings import DatabaseSettings

T0 = 1_767_225_600_000
PROJECTION_TABLES = (
    "users", "auth_tokens", "billing_projects", "billing_project_users", "resources",
    "batches", "batch_attributes", "batch_updates", "job_groups", "job_group_self_and_ancestors",
    "job_group_attributes", "jobs", "job_parents", "job_attributes", "job_group_job_counts",
    "batches_cancelled", "job_groups_cancelled", "user_inst_coll_resources",
    "job_group_inst_coll_cancellable_resources",
)


def job(job_id: int, group: int = 0, parents: Sequence[int] = (), *, always_run: bool = False,
        cores: int = 1000, name: str | None = None) -> JobRecord:
    return JobRecord(job_id=job_id, job_group_id=group, parent_ids=list(parents),
                     always_run=always_run, resources=JobResources(
                         cores_mcpu=cores, memory_bytes=cores * 3_840 * 1024),
                     inst_coll="standard", attributes={"name": name} if name else {},
                     spec=f'{{"job_id":{job_id}}}')


def submission(batch_id: int, update_id: int, jobs: Sequence[JobRecord],
               groups: Sequence[JobGroupRecord] = (), *, start_job_id: int = 1,
               start_group_id: int = 1, create: bool = False, user: str = "alice",
               commit: bool = True) -> list[AnyEvent]:
    events: list[AnyEvent] = []
    if create:
        events.append(BatchCreated(batch_id=batch_id, user=user, billing_project="proj",
                                   token=f"tok-{batch_id}", attributes={"name": "b"}))
    events.append(UpdateOpened(batch_id=batch_id, update_id=update_id, token=f"u{update_id}",
                               n_jobs=len(jobs), n_job_groups=len(groups),
                               start_job_id=start_job_id, start_job_group_id=start_group_id))
    if groups:
        events.append(JobGroupsSubmitted(batch_id=batch_id, update_id=update_id,
                                         job_groups=list(groups)))
    if jobs:
        events.append(JobsSubmitted(batch_id=batch_id, update_id=update_id, jobs=list(jobs)))
    if commit:
        events.append(UpdateCommitted(batch_id=batch_id, update_id=update_id,
                                      n_jobs=len(jobs), n_job_groups=len(groups)))
    return events


class Stream:
    """Assigns envelopes increasing offsets in one partition, with deterministic times."""

    def __init__(self, topic: str = "batch-events", partition: int = 0) -> None:
        self.topic, self.partition, self.offset = topic, partition, 0

    def records(self, events: Sequence[AnyEvent | Envelope]) -> list[Record]:
        out = []
        for ev in events:
            env = ev if isinstance(ev, Envelope) else wrap(
                ev, event_id=uuid.uuid4().hex, time_ms=T0 + self.offset)
            out.append(Record(self.topic, self.partition, self.offset, env))
            self.offset += 1
        return out


def snapshot(engine: sa.Engine, tables: Sequence[str] = PROJECTION_TABLES
             ) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    with engine.connect() as conn:
        for t in tables:
            rows = conn.execute(sa.text(f"SELECT * FROM `{t}`")).all()
            out[t] = sorted((tuple(r) for r in rows), key=repr)
    return out


def query(engine: sa.Engine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params).all()]


def fresh_engines(server: DatabaseSettings, n: int) -> Iterator[tuple[sa.Engine, str]]:
    import msgspec

    from sql.migrate import apply_migrations

    for _ in range(n):
        db = msgspec.structs.replace(server, name=f"hs_test_{uuid.uuid4().hex[:12]}")
        apply_migrations(db)
        yield sa.create_engine(db.url()), db.name
