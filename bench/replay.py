"""Replay figures: how fast ``python -m services.audit rebuild`` folds the log into a database.

Generates a realistic log on a fresh topic prefix: users, billing projects and rates on the
control topic; batches of ``batch_size`` jobs (created, one update, bunches of up to 1,024 jobs,
committed; one job in ten depends on the job before it; one in twenty fails) and, per job, SJ,
MJS and MJC with billed resources, the execution events of many batches interleaved as a busy
scheduler appends them. Then replays every partition into a freshly migrated database through
the projector's sink (:func:`services.audit.replay.replay`, as the rebuild does) and reports
events per second, with where the time went: in the sink (handlers, SQL, commits) or waiting
for the log, and the SQL write statements per event.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from decimal import Decimal
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from bench import cpu
from core.billing import attempt_resources, default_rates, machine_of
from core.projection.ops import InsertIgnore
from schemas import codec
from schemas.base import AttemptResource, JobResources
from schemas.batch import BatchCreated, JobRecord, JobsSubmitted, UpdateCommitted, UpdateOpened
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    ResourceRateSet,
    UserCreated,
)
from schemas.events import AnyEvent
from schemas.execution import JobCompleted, JobScheduled, JobStarted
from services.audit import cli as audit_cli
from services.audit.bulk import write_ops
from services.audit.load import CONNECT_ARGS
from services.audit.logread import PartitionReader
from services.audit.replay import ReplayStats, SinkTarget, replay, replay_processes, spans
from services.common import eventloop
from services.common.cpus import usable_cores
from services.common.log import Publisher, bootstrap_topics, delete_topics, high_watermarks
from services.common.settings import (
    ALL_TOPICS,
    DatabaseSettings,
    LogSettings,
    load_settings,
    projector_consumer,
)
from services.projector.app import PROJECTED_TOPICS
from services.projector.sink import Sink
from sql.migrate import apply_migrations

T0 = 1_767_225_600_000
BUNCH = 1_024
USERS = 20
RESOURCES = attempt_resources(1000, machine_of("standard", "n1-standard-16", True, 16_000))


def control_events() -> list[AnyEvent]:
    events: list[AnyEvent] = [ResourceRateSet(resource=r, rate=Decimal(rate))
                              for r, rate in sorted(default_rates().items())]
    for u in range(USERS):
        events += [UserCreated(user=f"user{u}"), BillingProjectCreated(billing_project=f"bp{u}"),
                   BillingProjectMemberAdded(billing_project=f"bp{u}", user=f"user{u}")]
    return events


def _job(job_id: int, rnd: random.Random) -> JobRecord:
    parents = [job_id - 1] if job_id > 1 and rnd.random() < 0.1 else []
    return JobRecord(job_id=job_id, job_group_id=0, parent_ids=parents,
                     resources=JobResources(cores_mcpu=1000, memory_bytes=3840 << 20),
                     inst_coll="standard", attributes={"name": f"job-{job_id}"},
                     spec=f'{{"process": {{"command": ["true"]}}, "job_id": {job_id}}}')


def submission(batch_id: int, n_jobs: int, rnd: random.Random) -> tuple[list[AnyEvent],
                                                                        list[JobRecord]]:
    u = batch_id % USERS
    jobs = [_job(j, rnd) for j in range(1, n_jobs + 1)]
    events: list[AnyEvent] = [
        BatchCreated(batch_id=batch_id, user=f"user{u}", billing_project=f"bp{u}",
                     token=f"t{batch_id}", attributes={"name": f"batch-{batch_id}"}),
        UpdateOpened(batch_id=batch_id, update_id=1, token="u1", n_jobs=n_jobs,
                     n_job_groups=0, start_job_id=1, start_job_group_id=1)]
    events += [JobsSubmitted(batch_id=batch_id, update_id=1, jobs=jobs[i:i + BUNCH])
               for i in range(0, n_jobs, BUNCH)]
    events.append(UpdateCommitted(batch_id=batch_id, update_id=1, n_jobs=n_jobs,
                                  n_job_groups=0))
    return events, jobs


def execution(batch_id: int, job: JobRecord, rnd: random.Random,
              resources: list[AttemptResource], *, may_fail: bool) -> list[AnyEvent]:
    attempt, worker = f"{batch_id}-{job.job_id}-a", f"worker-{rnd.randrange(8):02d}"
    start = T0 + 1000 * job.job_id
    end = start + rnd.randrange(1_000, 60_000)
    failed = may_fail and rnd.random() < 0.05
    return [
        JobScheduled(batch_id=batch_id, job_id=job.job_id, attempt_id=attempt,
                     instance_name=worker, inst_coll="standard", cores_mcpu=1000,
                     resources=resources),
        JobStarted(batch_id=batch_id, job_id=job.job_id, attempt_id=attempt,
                   instance_name=worker, start_time_ms=start, resources=resources),
        JobCompleted(batch_id=batch_id, job_id=job.job_id, attempt_id=attempt,
                     instance_name=worker, state="Failed" if failed else "Success",
                     exit_code=1 if failed else 0, start_time_ms=start, end_time_ms=end,
                     resources=resources, main_start_ms=start + 1, main_end_ms=end - 1),
    ]


def generate(n_jobs: int, batch_size: int, seed: int = 7) -> list[AnyEvent]:
    """The whole log, in append order."""
    rnd = random.Random(seed)
    events = control_events()
    runs: list[list[AnyEvent]] = []
    for b, start in enumerate(range(0, n_jobs, batch_size), start=1):
        sub, jobs = submission(b, min(batch_size, n_jobs - start), rnd)
        events += sub
        # Only jobs without children fail: a failed parent's child would never run.
        parents = {p for j in jobs for p in j.parent_ids}
        runs.append([e for j in jobs for e in execution(b, j, rnd, RESOURCES,
                                                         may_fail=j.job_id not in parents)])
    # Execution events of all batches interleaved (each batch's own order kept), wave by wave.
    for i in range(max(map(len, runs), default=0)):
        events += [run[i] for run in runs if i < len(run)]
    return events


async def _publish(log: LogSettings, events: list[AnyEvent], chunk: int = 5_000) -> float:
    t0 = time.perf_counter()
    async with Publisher(log) as pub:
        for i in range(0, len(events), chunk):
            await pub.publish_many(events[i:i + chunk])
    return time.perf_counter() - t0


async def _replay(log: LogSettings, db: DatabaseSettings, engine: sa.Engine, batch_size: int,
                  lanes: int, bulk: bool) -> ReplayStats:
    """As the rebuild replays: one lane in this process, or a process per lane."""
    marks = await high_watermarks(log, PROJECTED_TOPICS)
    todo = spans({}, marks, PROJECTED_TOPICS)
    if lanes > 1:
        return await replay_processes(log, SinkTarget(db, projector_consumer(log)), todo,
                                      batch_size=batch_size, processes=lanes, bulk=bulk)
    sink = Sink(engine, consumer=projector_consumer(log))
    return await replay(log, sink, todo, batch_size=batch_size, bulk=bulk)


async def _read_floor(log: LogSettings) -> tuple[int, float]:
    """(events, seconds) to read and decode every projected partition, applying nothing: the
    floor under any replay that reads this log through this client."""
    marks = await high_watermarks(log, PROJECTED_TOPICS)
    n, t0 = 0, time.perf_counter()
    async with PartitionReader(log, max_records=5_000) as reader:
        for span in spans({}, marks, PROJECTED_TOPICS):
            async for messages in reader.read(span.topic, span.partition, span.start, span.end):
                n += sum(1 for m in messages if codec.decode(m.value))
    return n, time.perf_counter() - t0


def _copy_floor(server: DatabaseSettings, source: str, n_events: int) -> dict[str, Any]:
    """How fast MariaDB alone can materialize the replayed projection: every table copied into
    a fresh schema server-side (``INSERT ... SELECT``, no client, no network), one table after
    another. No replay of these events into this schema can write its rows faster, so
    ``events / seconds`` (times the cores, were the copies spread over them) bounds any replay
    on this machine from above."""
    target = msgspec.structs.replace(server, name=f"hs_bench_copy_{uuid.uuid4().hex[:8]}")
    apply_migrations(target)
    engine = sa.create_engine(target.url(), poolclass=NullPool, connect_args=CONNECT_ARGS)
    try:
        with engine.begin() as conn:
            tables = [t for (t,) in conn.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_name != 'schema_migrations'", (target.name,)).all()]
            window = cpu.Window(b"HS_NO_PROCESS_HAS_THIS")  # MariaDB only
            window.start()
            rows, t0 = 0, time.perf_counter()
            per_table: dict[str, tuple[int, float]] = {}
            for t in tables:
                t1 = time.perf_counter()
                n = conn.exec_driver_sql(
                    f"INSERT INTO `{t}` SELECT * FROM `{source}`.`{t}`").rowcount
                per_table[t] = (n, time.perf_counter() - t1)
                rows += n
            seconds = time.perf_counter() - t0
            spent = window.stop(n_events, unit="event")
            client = _client_copy(conn, source, tables, n_events)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{target.name}`")
        engine.dispose()
    cores = os.cpu_count() or 1
    return {"projection_rows": rows, "projection_rows_per_event": round(rows / n_events, 2),
            "copy_floor_seconds": round(seconds, 3),
            # A submitted job is at least its row in `jobs` (read-your-writes reads it there):
            # this rate bounds how fast any submission can be visible, per core.
            "copy_floor_jobs_rows_per_s": round(per_table["jobs"][0] / per_table["jobs"][1]),
            # Where MariaDB's share of a replay goes: the tables that took longest to copy.
            "copy_floor_seconds_by_table": {
                t: [n, round(s, 3)] for t, (n, s) in sorted(
                    per_table.items(), key=lambda kv: -kv[1][1])[:6]},
            "copy_floor_mariadb_cpu_ms_per_event": spent["cpu_ms_per_event_total"],
            "copy_floor_events_per_s_per_core": round(n_events / seconds),
            f"copy_floor_events_per_s_{cores}_cores": round(cores * n_events / seconds),
            **client}


def _client_copy(conn: sa.Connection, source: str, tables: list[str], n_events: int
                 ) -> dict[str, Any]:
    """The same rows sent again from Python as bulk lanes write them (loaded from files, or
    multi-row inserts with literal values), into emptied tables: the CPU any replay written in
    Python spends only to hand the projection's rows to MariaDB, before folding a single
    event, MariaDB's share included."""
    data = {t: [dict(r) for r in conn.exec_driver_sql(
        f"SELECT * FROM `{source}`.`{t}`").mappings()] for t in tables}
    for t in tables:
        conn.exec_driver_sql(f"DELETE FROM `{t}`")
    window = cpu.Window(b"HS_NO_PROCESS_HAS_THIS", own="python client")
    window.start()
    write_ops(conn, [InsertIgnore(t, rows) for t, rows in data.items() if rows])
    spent = window.stop(n_events, unit="event")
    return {"client_copy_cpu_ms_per_event": spent["cpu_ms_per_event"],
            "client_copy_cpu_ms_per_event_total": spent["cpu_ms_per_event_total"],
            "client_copy_ceiling_events_per_s": spent["ceiling_per_s"]}


def _figures(stats: ReplayStats, lanes: int) -> dict[str, Any]:
    busy = stats.wall_s * lanes
    return {
        "seconds": round(stats.wall_s, 2),
        "events_per_s": round(stats.events_per_s),
        "sink_share": round(stats.apply_s / busy, 3) if busy else 0,
        "waiting_for_log_share": round(stats.wait_s / busy, 3) if busy else 0,
        "transactions": stats.transactions,
        "folded_share": round(stats.folded / stats.events, 3) if stats.events else 0,
    }


DEFAULT_LANES = audit_cli.BULK_LANES
"""The rebuild's default (``python -m services.audit rebuild``): a bulk lane process per core."""


MODES: tuple[tuple[int, bool], ...] = ((DEFAULT_LANES, True), (1, True),
                                       (audit_cli.SINK_LANES, False))
"""(lanes, bulk) of each replay: the rebuild's default first, then one bulk lane, then the
default lanes through the sink alone (as the rebuild ran before bulk lanes)."""


def modes_now() -> tuple[tuple[int, bool], ...]:
    """:data:`MODES` for the cores this process may use now: a bench that entered a CPU quota
    after this module was imported (``--cpu-quota``) replays as a rebuild started under it
    would (:func:`services.common.cpus.usable_cores`)."""
    cores = usable_cores()
    return tuple(dict.fromkeys(((cores, True), (1, True), (2 * cores, False))))  # 1 core: 1 lane


def run(bootstrap: str, n_jobs: int = 4_000, batch_size: int = 100,
        replay_batch: int = 5_000, modes: tuple[tuple[int, bool], ...] = MODES,
        marker: bytes = b"") -> dict[str, Any]:
    """Publish a generated log, then replay it once per entry of ``modes`` (fresh databases).

    Figures named ``replay_*`` are the rebuild's default (a bulk lane process per core: the
    figure the target judges); ``replay_<n>_lanes_*`` the other entries (``_sink``:
    without bulk folding), ``replay_1_lanes_*`` one lane in this process. ``marker``: a string
    in the environment of the broker's processes, to count their CPU.
    """
    settings = load_settings()
    log = msgspec.structs.replace(settings.log, bootstrap_servers=bootstrap,
                                  topic_prefix=f"bench-replay-{uuid.uuid4().hex[:8]}-")
    events = generate(n_jobs, batch_size)
    asyncio.run(bootstrap_topics(log))
    try:
        publish_s = asyncio.run(_publish(log, events))
        out: dict[str, Any] = {"jobs": n_jobs, "events": len(events),
                               "partitions": log.partitions,
                               "publish_events_per_s": round(len(events) / publish_s)}
        window = cpu.Window(marker, own="reader")
        window.start()
        read, read_s = asyncio.run(_read_floor(log))
        out |= {"log_read_decode_events_per_s": round(read / read_s),
                "log_read_cpu_ms_per_event": window.stop(read, unit="event")["cpu_ms_per_event"]}
        for n, bulk in modes:
            db = msgspec.structs.replace(settings.db,
                                         name=f"hs_bench_replay_{uuid.uuid4().hex[:8]}")
            apply_migrations(db)
            engine = sa.create_engine(db.url(), pool_size=n + 1, max_overflow=n,  # as rebuild
                                      connect_args=CONNECT_ARGS)
            # Lane processes are reaped children: their CPU counts as the sink's.
            window = cpu.Window(marker, own="replay (projector sink)",
                                children_as="replay (projector sink)")
            window.start()
            try:
                stats = eventloop.run(_replay(log, db, engine, replay_batch, n, bulk),
                                      eventloop.loop_factory())
                spent = window.stop(len(events), unit="event")
                with engine.connect() as conn:
                    done = conn.execute(sa.text("SELECT COUNT(*) FROM jobs WHERE state IN "
                                                "('Success', 'Failed')")).scalar()
                if (n, bulk) == modes[0]:
                    out |= _copy_floor(settings.db, db.name, len(events))
                    # Reading the log and writing the rows, with no fold between: no replay
                    # in this stack can go faster with every core on it.
                    floor_ms = (sum(out["log_read_cpu_ms_per_event"].values())
                                + out["client_copy_cpu_ms_per_event_total"])
                    out["no_fold_ceiling_events_per_s"] = round(
                        (os.cpu_count() or 1) * 1000 / floor_ms)
            finally:
                engine.dispose()
                with sa.create_engine(db.url(database=False),
                                      poolclass=NullPool).begin() as conn:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db.name}`")
            if done != n_jobs:
                raise AssertionError(f"the replay ended {done} of {n_jobs} jobs")
            prefix = ("replay" if (n, bulk) == modes[0]
                      else f"replay_{n}_lanes" + ("" if bulk else "_sink"))
            out |= {f"{prefix}_{k}": v for k, v in (_figures(stats, n) | spent).items()}
            if (n, bulk) == modes[0]:
                out["replay_lanes"] = n
                out["write_statements_per_event"] = round(stats.statements / stats.events, 2)
        return out
    finally:
        asyncio.run(delete_topics(log, ALL_TOPICS))
