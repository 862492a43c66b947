"""The audit commands on the real broker and MariaDB, against the projector running as a process.

One log and one live database for the module: a small but varied history (groups, a DAG,
updates, SJ/MJS/MJC, a lost attempt, cancellations, a completion on the completions topic),
published in several rounds so the live projector folds it in other transactions than the
replay does.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa

from schemas.base import AttemptResource
from schemas.batch import BatchCancelled, BatchCompleted, JobGroupCancelled, JobGroupRecord
from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    ResourceRateSet,
    UserCreated,
)
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobScheduled,
    JobStarted,
)
from services.audit import replay as replay_module
from services.audit.rebuild import (
    AuditError,
    RebuildOptions,
    Reporter,
    database_exists,
    drop_database,
    rebuild,
)
from services.audit.replay import ReplayError, SinkTarget, Span, replay_processes, spans
from services.audit.tables import Comparison
from services.common import procs
from services.common.log import Publisher, bootstrap_topics, high_watermarks
from services.common.settings import (
    DatabaseSettings,
    Settings,
    load_settings,
    projector_consumer,
)
from services.ingest.store import Store
from services.projector.app import PROJECTED_TOPICS
from sql.migrate import apply_migrations

from .projection_helpers import job, query, submission

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600_000
RES = [AttemptResource(resource="compute/n1-standard/1", quantity=1000)]


def sj(b: int, j: int, a: str) -> JobScheduled:
    return JobScheduled(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        inst_coll="standard", cores_mcpu=1000)


def mjs(b: int, j: int, a: str) -> JobStarted:
    return JobStarted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                      start_time_ms=T0 + 10, resources=RES)


def mjc(b: int, j: int, a: str, state: str = "Success") -> JobCompleted:
    return JobCompleted(batch_id=b, job_id=j, attempt_id=a, instance_name="w1",
                        state=state,  # type: ignore[arg-type]
                        exit_code=0 if state == "Success" else 1, start_time_ms=T0 + 10,
                        end_time_ms=T0 + 20, resources=RES,
                        # every other one compact: the facts its document follows from
                        **({"status": '{"state": "done"}'} if j % 2 else {
                            "main_start_ms": T0 + 11, "main_end_ms": T0 + 19,
                            "region": "us-central1"}))


def rounds(b: int) -> list[list[AnyEvent]]:
    """Batches b (groups, a DAG, a failure), b+1 (cancelled), b+2 (two updates, a lost attempt)."""
    return [
        [UserCreated(user="alice"), BillingProjectCreated(billing_project="proj"),
         BillingProjectMemberAdded(billing_project="proj", user="alice"),
         ResourceRateSet(resource="compute/n1-standard/1", rate=Decimal("0.00001"))],
        [*submission(b, 1, [job(1, 1), job(2, 2, [1]), job(3, 0, [1], always_run=True),
                            job(4, 0)],
                     [JobGroupRecord(job_group_id=1, parent_id=0),
                      JobGroupRecord(job_group_id=2, parent_id=1)], create=True),
         *submission(b + 1, 1, [job(1), job(2), job(3, 0, [1])], create=True),
         *submission(b + 2, 1, [job(1), job(2, 0, [1])], create=True)],
        [sj(b, 1, "a1"), mjs(b, 1, "a1"), sj(b, 4, "a4"), sj(b + 1, 1, "a1"),
         sj(b + 2, 1, "a1"), mjs(b + 2, 1, "a1")],
        [AttemptHeartbeat(batch_id=b, job_id=1, attempt_id="a1", instance_name="w1",
                          rollup_time_ms=T0 + 15),
         mjc(b, 1, "a1", "Failed"), mjc(b, 4, "a4"), BatchCancelled(batch_id=b + 1),
         AttemptLost(batch_id=b + 2, job_id=1, attempt_id="a1", instance_name="w1",
                     reason="preempted", end_time_ms=T0 + 30)],
        [sj(b, 3, "a3"), mjc(b, 3, "a3"), JobCancelled(batch_id=b + 1, job_id=2, reason="user"),
         mjc(b + 1, 1, "a1", "Failed"), sj(b + 2, 1, "a2"), mjc(b + 2, 1, "a2"),
         *submission(b + 2, 2, [job(3, 0, [2]), job(4)], start_job_id=3),
         JobGroupCancelled(batch_id=b, job_group_id=1),
         BatchCompleted(batch_id=b, outcome="failure", n_jobs=4, n_succeeded=2, n_failed=1,
                        n_cancelled=1, time_completed_ms=T0 + 40)],
    ]


def _exit_at_once(*args: object) -> None:
    os._exit(3)


@dataclass
class Live:
    settings: Settings
    env: dict[str, str]
    engine: sa.Engine
    batch: int
    projector: subprocess.Popen[bytes]

    def publish(self, events: list[AnyEvent], *, wait: bool = True) -> None:
        async def go() -> None:
            async with Publisher(self.settings.log) as pub:
                positions = await pub.publish_many(events)
            projected = [p for p in positions if p.topic != "completions"]
            if wait:
                assert await Store(self.engine, projector_consumer(self.settings.log)
                                   ).wait_applied(projected, timeout_s=90)
        asyncio.run(go())

    def audit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "services.audit", *args], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def live(broker: str, migrated_db: DatabaseSettings,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    log = msgspec.structs.replace(load_settings().log, bootstrap_servers=broker, partitions=4,
                                  topic_prefix=f"a{uuid.uuid4().hex[:10]}-")
    settings = Settings(log=log, db=migrated_db)
    asyncio.run(bootstrap_topics(log))
    env = {**os.environ, "HS_KAFKA_BOOTSTRAP": broker, "HS_TOPIC_PREFIX": log.topic_prefix,
           "HS_KAFKA_PARTITIONS": "4", "HS_DB_NAME": migrated_db.name,
           "HS_DB_HOST": migrated_db.host, "HS_DB_PORT": str(migrated_db.port)}
    tmp = tmp_path_factory.mktemp("audit")
    projector = procs.spawn([sys.executable, "-m", "services.projector"],
                            log_path=tmp / "projector.log", env=env, cwd=REPO)
    engine = sa.create_engine(migrated_db.url())
    try:
        system = Live(settings, env, engine, 41, projector)
        for events in rounds(system.batch):
            system.publish(events)
        yield system
    finally:
        procs.terminate(projector.pid)
        projector.wait(timeout=30)
        engine.dispose()


# --- history ------------------------------------------------------------------------------------

def test_the_history_of_a_batch_is_its_events_in_log_order(live: Live) -> None:
    out = live.audit("history", "--batch", str(live.batch))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    tags = [line.split()[2] for line in lines]
    assert tags == [
        "batch.created", "batch.update_opened", "batch.job_groups_submitted",
        "batch.jobs_submitted", "batch.update_committed", "job.scheduled", "job.started",
        "job.scheduled", "attempt.heartbeat", "job.completed", "job.completed", "job.scheduled",
        "job.completed", "job_group.cancelled", "batch.completed"]
    assert lines[3].split()[3:5] == ["jobs=1..4", "(n=4)"]
    partitions = {line.split("@")[0] for line in lines if line.startswith("batch-events")}
    assert len(partitions) == 1  # one key, one partition
    assert lines[-1].startswith("completions[")


def test_the_history_of_a_job_as_json_lines(live: Live) -> None:
    out = live.audit("history", "--batch", str(live.batch), "--job", "2", "--json")
    assert out.returncode == 0, out.stderr
    entries = [json.loads(line) for line in out.stdout.splitlines()]
    assert [e["tag"] for e in entries] == [
        "batch.created", "batch.update_opened", "batch.job_groups_submitted",
        "batch.jobs_submitted", "batch.update_committed", "job_group.cancelled",
        "batch.completed"]
    bunch = entries[3]
    assert [j["job_id"] for j in bunch["event"]["jobs"]] == [2]
    assert bunch["key"] == str(live.batch) and bunch["topic"] == "batch-events"
    offsets = [e["offset"] for e in entries if e["topic"] == "batch-events"]
    assert offsets == sorted(offsets)


def test_the_history_of_an_executed_job(live: Live) -> None:
    out = live.audit("history", "--batch", str(live.batch + 2), "--job", "1")
    assert out.returncode == 0, out.stderr
    tags = [line.split()[2] for line in out.stdout.splitlines()]
    assert tags == ["batch.created", "batch.update_opened", "batch.jobs_submitted",
                    "batch.update_committed", "job.scheduled", "job.started", "attempt.lost",
                    "job.scheduled", "job.completed"]
    assert "reason=preempted" in out.stdout.splitlines()[6]


@pytest.mark.parametrize(("args", "message"), [
    (("--batch", "999999"), "batch 999999 has no events"),
    (("--batch", "41", "--job", "77"), "batch 41 has no job 77"),
], ids=["unknown-batch", "unknown-job"])
def test_unknown_batches_and_jobs_are_errors(live: Live, args: tuple[str, ...],
                                             message: str) -> None:
    out = live.audit("history", *args)
    assert out.returncode == 1
    assert message in out.stderr and out.stdout == ""


# --- rebuild ------------------------------------------------------------------------------------

def test_a_rebuild_of_the_log_has_no_differences(live: Live) -> None:
    result = asyncio.run(rebuild(live.settings))
    assert result.differences == []
    assert result.tables >= 20
    assert result.replay.events == sum(result.marks.values()) > 30
    assert result.offsets == {tp: n for tp, n in result.marks.items() if n}
    assert not database_exists(live.settings.db, result.database)  # dropped


def test_a_rebuild_in_parallel_lanes_has_no_differences(live: Live) -> None:
    result = asyncio.run(rebuild(live.settings, RebuildOptions(lanes=4, batch_size=7)))
    assert result.differences == [] and result.replay.transactions > 4


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_lane_processes_report_every_record_and_fill_the_database(
        live: Live, start_method: replay_module.StartMethod) -> None:
    marks = asyncio.run(high_watermarks(live.settings.log, PROJECTED_TOPICS))
    todo = spans({}, marks, PROJECTED_TOPICS)
    db = msgspec.structs.replace(live.settings.db, name=f"{live.settings.db.name}_lanes")
    apply_migrations(db)
    seen: dict[Span, int] = {}

    def progress(span: Span, n: int) -> None:
        seen[span] = seen.get(span, 0) + n

    try:
        target = SinkTarget(db, projector_consumer(live.settings.log))
        stats = asyncio.run(replay_processes(live.settings.log, target, todo, batch_size=5,
                                             processes=3, progress=progress,
                                             start_method=start_method))
        assert seen == {span: span.size for span in todo}
        assert stats.events == sum(span.size for span in todo) and stats.transactions > 3
        (jobs,) = query(sa.create_engine(db.url()), "SELECT COUNT(*) FROM jobs")
        assert jobs[0] == 11
    finally:
        drop_database(live.settings.db, db.name)


def test_forked_lanes_leave_the_parents_connections_and_threads_alone(live: Live) -> None:
    """Lanes forked beside a thread and a pooled connection: the replay completes, and what the
    parent holds still works after (a child that closed or used it would break it)."""
    marks = asyncio.run(high_watermarks(live.settings.log, PROJECTED_TOPICS))
    todo = spans({}, marks, PROJECTED_TOPICS)
    db = msgspec.structs.replace(live.settings.db, name=f"{live.settings.db.name}_forked")
    apply_migrations(db)
    engine = sa.create_engine(db.url(), pool_size=1, max_overflow=0)
    with engine.connect() as conn:
        before = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
    stop = threading.Event()
    beside = threading.Thread(target=stop.wait, name="beside-the-fork")
    beside.start()
    try:
        assert threading.active_count() > 1
        stats = asyncio.run(replay_processes(
            live.settings.log, SinkTarget(db, projector_consumer(live.settings.log)), todo,
            batch_size=5, processes=2, bulk=True, start_method="fork"))
        assert stats.events == sum(span.size for span in todo)
        assert gc.get_freeze_count() == 0  # the parent's heap is collectable again
        with engine.connect() as conn:  # the same pooled connection, still usable
            assert conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar() == before
            (jobs,) = conn.exec_driver_sql("SELECT COUNT(*) FROM jobs").one()
        assert jobs == 11
        assert beside.is_alive()
    finally:
        stop.set()
        beside.join()
        engine.dispose()
        drop_database(live.settings.db, db.name)


def test_a_failing_lane_process_fails_the_replay_with_its_error(live: Live) -> None:
    marks = asyncio.run(high_watermarks(live.settings.log, PROJECTED_TOPICS))
    missing = msgspec.structs.replace(live.settings.db, name="hs_no_such_database")
    target = SinkTarget(missing, projector_consumer(live.settings.log))
    with pytest.raises(sa.exc.OperationalError, match="Unknown database"):
        asyncio.run(replay_processes(live.settings.log, target,
                                     spans({}, marks, PROJECTED_TOPICS), processes=2))


class _HeldStream:
    """A text stream on a file whose writes take a lock, held by a thread of the parent at the
    fork as a buffered stream's is while that thread writes. Its flush does not: the flush
    multiprocessing makes just before it forks passes, as it does when the thread takes the
    lock between that flush and the fork."""

    encoding, errors, line_buffering = "utf-8", "strict", True

    def __init__(self, path: Path) -> None:
        self.file = path.open("w")
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            written = self.file.write(text)
            self.file.flush()
            return written

    def flush(self) -> None:
        self.file.flush()

    def fileno(self) -> int:
        return self.file.fileno()


def _write_to_stderr(own: bool) -> None:
    if own:
        replay_module.own_std_streams()
    print("printed", file=sys.stderr)
    logging.getLogger("hs.test.held").error("logged")
    sys.stderr.flush()


@pytest.mark.parametrize("own", [True, False], ids=["own-streams", "inherited-streams"])
def test_a_forked_child_writes_though_a_parent_thread_held_stderr(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, own: bool) -> None:
    """A thread of the parent holds stderr's lock through the fork: the child's copy of that
    lock stays held. With streams of its own (what a lane process takes first) the child
    prints and logs to the same file; with the inherited ones it waits forever."""
    held = _HeldStream(tmp_path / "stderr")
    monkeypatch.setattr(sys, "stderr", held)
    handler = logging.StreamHandler(held)
    logging.getLogger("hs.test.held").addHandler(handler)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with held.lock:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    child = multiprocessing.get_context("fork").Process(target=_write_to_stderr, args=(own,))
    try:
        holding.wait()
        child.start()
        child.join(timeout=10 if own else 2)
        if own:
            assert child.exitcode == 0
        else:
            assert child.is_alive()  # stuck on the lock's copy
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        release.set()
        holder.join()
        logging.getLogger("hs.test.held").removeHandler(handler)
        held.file.close()
    written = (tmp_path / "stderr").read_text()
    assert written == ("printed\nlogged\n" if own else "")


def test_a_lane_process_that_dies_fails_the_replay(live: Live,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    marks = asyncio.run(high_watermarks(live.settings.log, PROJECTED_TOPICS))
    target = SinkTarget(live.settings.db, projector_consumer(live.settings.log))
    # A lane that exits without a word, as a killed process would (the replay's own entry
    # point is replaced by one that only exits).
    monkeypatch.setattr(replay_module, "_lane_process", _exit_at_once)
    with pytest.raises(ReplayError, match=r"replay-lane-\d exited with code 3"):
        asyncio.run(replay_processes(live.settings.log, target,
                                     spans({}, marks, PROJECTED_TOPICS), processes=2))


def test_the_command_exits_zero_and_keeps_the_database_when_asked(live: Live) -> None:
    name = f"{live.settings.db.name}_kept"
    try:
        out = live.audit("rebuild", "--database", name, "--keep")
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout == ""  # differences only
        assert "0 differences" in out.stderr and name in out.stderr
        assert database_exists(live.settings.db, name)
        (jobs,) = query(sa.create_engine(msgspec.structs.replace(
            live.settings.db, name=name).url()), "SELECT COUNT(*) FROM jobs")
        assert jobs[0] == 11
        with live.engine.connect() as a, live.engine.connect() as b:
            small_chunks = Comparison(a, live.settings.db.name, b, name, chunk_rows=2)
            assert list(small_chunks) == [] and small_chunks.tables >= 20
        refused = live.audit("rebuild", "--database", name)
        assert refused.returncode == 2 and "exists already" in refused.stderr
    finally:
        drop_database(live.settings.db, name)


def test_altered_live_rows_are_reported_with_exit_code_one(live: Live) -> None:
    b = live.batch
    ((inst_coll, token),) = query(live.engine, "SELECT inst_coll, token FROM "
                                  "user_inst_coll_resources WHERE user = 'alice' LIMIT 1")
    counter = sa.text("UPDATE user_inst_coll_resources SET n_ready_jobs = n_ready_jobs + :d "
                      "WHERE user = 'alice' AND inst_coll = :ic AND token = :t")
    with live.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET state = 'Running' WHERE batch_id = :b "
                             "AND job_id = 4"), {"b": b})
        conn.execute(counter, {"d": 5, "ic": inst_coll, "t": token})
        conn.execute(sa.text("INSERT INTO batch_attributes VALUES (:b, 'forged', 'x')"),
                     {"b": b})
    try:
        out = live.audit("rebuild")
        assert out.returncode == 1, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        assert f"jobs  batch_id={b} job_id=4  state  live='Running'  rebuilt='Success'" in lines
        (token_diff,) = [line for line in lines if line.startswith("user_inst_coll_resources")]
        assert token_diff.startswith(f"user_inst_coll_resources  user='alice' "
                                     f"inst_coll='{inst_coll}'  n_ready_jobs  live=")
        assert (f"batch_attributes  batch_id={b} attr_key='forged'  *  "
                f"live={{attr_value='x'}}  rebuilt=<absent>") in lines
        assert len(lines) == 3
        assert "3 differences" in out.stderr
    finally:
        with live.engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET state = 'Success' WHERE batch_id = :b "
                                 "AND job_id = 4"), {"b": b})
            conn.execute(counter, {"d": -5, "ic": inst_coll, "t": token})
            conn.execute(sa.text("DELETE FROM batch_attributes WHERE attr_key = 'forged'"))


class _PublishDuringReplay(Reporter):
    """Appends a round once the log end is captured and waits until the projector applied it:
    the live projector is then past the captured end, and the rebuild must catch up."""

    def __init__(self, live: Live, events: list[AnyEvent]) -> None:
        self.live, self.events, self.done = live, events, False

    def message(self, text: str) -> None:
        if text.startswith("log end captured") and not self.done:
            self.done = True
            worker = threading.Thread(target=self.live.publish, args=(self.events,))
            worker.start()
            worker.join()


def test_a_rebuild_while_events_arrive_catches_up_to_the_live_snapshot(live: Live) -> None:
    b = live.batch + 10
    reporter = _PublishDuringReplay(live, submission(b, 1, [job(1), job(2, 0, [1])],
                                                     create=True))
    result = asyncio.run(rebuild(live.settings, reporter=reporter))
    assert reporter.done
    assert result.catch_up.events >= 4
    assert result.differences == []


def test_a_rebuild_waits_for_a_lagging_projector_then_gives_up(live: Live) -> None:
    procs.terminate(live.projector.pid)
    live.projector.wait(timeout=30)
    live.publish([UserCreated(user="late")], wait=False)
    with pytest.raises(AuditError, match=r"still 1 events behind .* is it running"):
        asyncio.run(rebuild(live.settings, RebuildOptions(wait_s=1)))
    assert not database_exists(live.settings.db, f"{live.settings.db.name}_rebuild")


def test_lane_processes_fork_on_linux_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    assert replay_module.lane_start_method() == "fork"
    for other in ("darwin", "win32"):
        monkeypatch.setattr(sys, "platform", other)
        assert replay_module.lane_start_method() == "spawn"


def test_starting_lanes_leaves_a_frozen_heap_frozen() -> None:
    """A service froze its start-up heap for good (services.common.gcpause): starting lanes
    does not thaw it. A heap that was not frozen is collectable again after."""
    replay_module._start([])
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        replay_module._start([])
        assert gc.get_freeze_count() == frozen > 0
    finally:
        gc.unfreeze()
