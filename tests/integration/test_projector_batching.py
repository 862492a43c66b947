"""The projector's per-transaction cache and merged writes change nothing: a log applied in big
transactions gives the same projections as the same log applied one record per transaction
(where nothing can be cached or merged across events), compared as the audit compares."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from bench.replay import RESOURCES, submission
from core.billing import default_rates
from schemas.batch import BatchCancelled
from schemas.control import ResourceRateSet
from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    JobCancelled,
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
)
from schemas.infra import (
    InstanceActivated,
    InstanceCreated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceRequested,
    SchedulerElected,
    SchedulerEvent,
)
from services.audit.tables import Comparison
from services.common.log import Record
from services.common.settings import DatabaseSettings
from services.projector import sink as sink_module
from services.projector.sink import Sink

from .projection_helpers import T0, Stream, fresh_engines, job
from .projection_helpers import submission as update

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engines(db_server: DatabaseSettings) -> Iterator[list[tuple[sa.Engine, str]]]:
    pairs = list(fresh_engines(db_server, 2))
    yield pairs
    for engine, name in pairs:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        engine.dispose()


def _job_events(b: int, job_id: int, rnd: random.Random, t: int) -> list[AnyEvent]:
    """One job's execution, with losses, heartbeats, duplicates and (rarely) a user cancel."""
    out: list[AnyEvent] = []
    if rnd.random() < 0.05:
        return [JobCancelled(batch_id=b, job_id=job_id, reason="user")]
    for n in range(rnd.choice([1, 1, 1, 2, 3])):
        a, w = f"a{n}", f"w{rnd.randint(1, 3)}"
        start = t + 1_000 * n
        out.append(JobScheduled(batch_id=b, job_id=job_id, attempt_id=a, instance_name=w,
                                inst_coll="standard", cores_mcpu=1000, resources=RESOURCES))
        out.append(JobStarted(batch_id=b, job_id=job_id, attempt_id=a, instance_name=w,
                              start_time_ms=start, resources=RESOURCES))
        for k in range(rnd.randint(0, 2)):
            out.append(AttemptHeartbeat(batch_id=b, job_id=job_id, attempt_id=a,
                                        instance_name=w, rollup_time_ms=start + 300 * (k + 1)))
        if n < 2 and rnd.random() < 0.3:
            out.append(AttemptLost(batch_id=b, job_id=job_id, attempt_id=a, instance_name=w,
                                   reason="preempted", end_time_ms=start + 900))
            continue
        out.append(JobCompleted(batch_id=b, job_id=job_id, attempt_id=a, instance_name=w,
                                state=rnd.choice(["Success", "Success", "Failed"]),
                                exit_code=0, start_time_ms=start, end_time_ms=start + 950,
                                resources=RESOURCES))
        break
    if out and rnd.random() < 0.2:
        out.append(rnd.choice(out))  # a redelivered event
    return out


def _instances(rnd: random.Random) -> list[AnyEvent]:
    """The workers' lifecycles, some duplicated or late (an activation after the deletion)."""
    out: list[AnyEvent] = [SchedulerElected(epoch=1, scheduler_id="s")]
    for n in range(1, 5):
        w = f"w{n}"
        life: list[AnyEvent] = [
            InstanceRequested(instance_name=w, inst_coll="standard", machine_type="m",
                              region="local", cores_mcpu=4000, preemptible=True),
            InstanceCreated(instance_name=w, inst_coll="standard"),
            InstanceActivated(instance_name=w, address=f"127.0.0.1:{5000 + n}",
                              cores_mcpu=4000)]
        if n == 4:
            life += [InstanceDeactivated(instance_name=w, reason="idle"),
                     InstanceDeleted(instance_name=w, reason="idle"), life[2]]
        if rnd.random() < 0.5:
            life.insert(rnd.randint(1, len(life)), rnd.choice(life))
        out += life
    return out


def history(seed: int) -> list[AnyEvent]:
    rnd = random.Random(seed)
    events: list[AnyEvent] = [ResourceRateSet(resource=r, rate=Decimal(rate))
                              for r, rate in sorted(default_rates().items())]
    events += _instances(rnd)
    runs: list[list[AnyEvent]] = []
    for b in range(1, 5):
        sub, jobs = submission(b, 40, rnd)
        events += sub
        run: list[AnyEvent] = []
        for j in jobs:
            run += _job_events(b, j.job_id, rnd, T0 + 10_000 * j.job_id)
        if b == 2:  # one batch is cancelled half-way through its execution
            run.insert(len(run) // 2, BatchCancelled(batch_id=b, reason="user"))
        # the canceller ends what never ran (children of failed jobs...): batches complete
        run += [JobCancelled(batch_id=b, job_id=j.job_id, reason="parent_failed")
                for j in jobs]
        if b == 3:  # completes, then an update adds jobs right away: it completes again
            more = [job(41), job(42, parents=[41])]
            run += update(b, 2, more, start_job_id=41)
            for j in more:
                run += _job_events(b, j.job_id, rnd, T0 + 10_000 * j.job_id)
            run += [JobCancelled(batch_id=b, job_id=j.job_id, reason="parent_failed")
                    for j in more]
        runs.append(run)
    for i in range(max(map(len, runs))):
        events += [run[i] for run in runs if i < len(run)]
    return events


def _records(events: Sequence[AnyEvent | Envelope]) -> list[Record]:
    def of(e: AnyEvent | Envelope) -> AnyEvent:
        return e.event if isinstance(e, Envelope) else e

    control = [e for e in events if isinstance(of(e), ResourceRateSet)]
    scheduler = [Stream(topic="scheduler-events", partition=p) for p in (0, 1)]
    instances = [scheduler[sum(map(ord, of(e).key())) % 2].records([e])[0] for e in events
                 if isinstance(of(e), SchedulerEvent)]
    return (Stream(topic="control-events").records(control) + instances
            + Stream().records([e for e in events
                                if not isinstance(of(e), ResourceRateSet | SchedulerEvent)]))


def _empty(engines: list[tuple[sa.Engine, str]]) -> None:
    for engine, _ in engines:
        with engine.begin() as conn:  # every test starts from empty projections
            for (table,) in conn.exec_driver_sql(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                    "DATABASE() AND table_name != 'schema_migrations'").all():
                conn.exec_driver_sql(f"DELETE FROM `{table}`")


def timed(events: list[AnyEvent]) -> list[Envelope]:
    return [wrap(e, event_id=uuid.uuid4().hex, time_ms=T0 + i) for i, e in enumerate(events)]


def bunched(log: list[Envelope]) -> list[Envelope]:
    """The log with SJs and MJCs bunched as the scheduler and the workers bunch them: an SJ
    joins its batch's open bunch of SJs, an MJC its batch's and instance's open bunch of MJCs,
    unless another event of that batch came between them. A bunch has the time and id of its
    first event (the rest of the log keeps its times)."""
    out: list[Envelope | list[Envelope]] = []
    open_bunch: dict[tuple[int, str], list[Envelope]] = {}
    for env in log:
        e = env.event
        key = (e.batch_id, "SJ") if isinstance(e, JobScheduled) else (
            (e.batch_id, e.instance_name) if isinstance(e, JobCompleted) else None)
        if key is None:
            batch = getattr(e, "batch_id", None)
            open_bunch = {k: v for k, v in open_bunch.items() if k[0] != batch}
            out.append(env)
        elif key in open_bunch:
            open_bunch[key].append(env)
        else:
            open_bunch = {k: v for k, v in open_bunch.items() if k[0] != key[0]}
            open_bunch[key] = [env]
            out.append(open_bunch[key])
    return [x if not isinstance(x, list) else wrap(_bunch([y.event for y in x]),
                                                   event_id=x[0].event_id, time_ms=x[0].time_ms)
            for x in out]


def _bunch(events: list[AnyEvent]) -> AnyEvent:
    if all(isinstance(e, JobScheduled) for e in events):
        sjs = [e for e in events if isinstance(e, JobScheduled)]
        return JobsScheduled.of(sjs[0].batch_id, sjs)
    return JobsCompleted.of([e for e in events if isinstance(e, JobCompleted)])


@pytest.mark.parametrize(("seed", "fold_chunk", "behind"),
                         [(1, 500, False), (2, 500, False), (3, 7, False), (6, 500, True),
                          (7, 7, True)])
def test_big_transactions_equal_one_record_per_transaction(
        engines: list[tuple[sa.Engine, str]], seed: int, fold_chunk: int, behind: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Also while a transaction hands each chunk's statements to its pipeline and folds the
    next (``FOLD_CHUNK``): the 700-record transactions split once at 500, or every 7; and
    while each commits as the next one folds (``behind``, as the projector applies)."""
    monkeypatch.setattr(sink_module, "FOLD_CHUNK", fold_chunk)
    monkeypatch.setattr(sink_module, "BEHIND_MIN_JOBS", 100)
    (batched, _), _ = engines
    _empty(engines)
    records = _records(history(seed))
    sink = Sink(batched, f"batched-{seed}", commit_behind=behind)
    for i in range(0, len(records), 700):
        sink.apply(records[i:i + 700])
    sink.apply([])  # waits for the last commit behind
    assert sink.behind_for() == 0
    _same_as_one_record_at_a_time(engines, records, seed)


class _Once:
    """Raises ``error`` on the ``nth`` call, else calls ``fn``."""

    def __init__(self, fn: Callable[..., Any], nth: int, error: Exception) -> None:
        self.fn, self.nth, self.error, self.calls = fn, nth, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.nth:
            raise self.error
        return self.fn(*args, **kwargs)


@pytest.mark.parametrize("failure", ["check", "save", "fold"])
def test_a_transaction_behind_that_fails_is_applied_again(
        engines: list[tuple[sa.Engine, str]], failure: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction committing behind fails after its ``apply`` returned: its positions were
    not what the one before stored (``check``), or its statements failed (``save``), or the
    next one's fold failed while it committed (``fold``). The next ``apply`` raises, and
    retried, applies the failed transaction's records first: nothing lost, nothing twice."""
    monkeypatch.setattr(sink_module, "BEHIND_MIN_JOBS", 100)
    (batched, _), _ = engines
    _empty(engines)
    records = _records(history(8))
    sink = Sink(batched, "behind-fails", commit_behind=True)
    if failure == "check":
        monkeypatch.setattr(sink, "_check", _Once(sink._check, 2, sink_module.Stale("test")))
    elif failure == "save":
        monkeypatch.setattr(sink.store, "save", _Once(
            sink.store.save, 3, sa.exc.OperationalError("UPDATE", {}, Exception("gone"))))
    else:
        monkeypatch.setattr(sink, "_fold_with", _Once(
            sink._fold_with, 3, sa.exc.OperationalError("SELECT", {}, Exception("gone"))))
    raised = 0
    for i in [*range(0, len(records), 150), None]:
        batch = [] if i is None else records[i:i + 150]
        try:
            sink.apply(batch)
        except (sink_module.Stale, sa.exc.OperationalError):
            raised += 1
            sink.apply(batch)  # as the projector retries
    assert raised == 1
    _same_as_one_record_at_a_time(engines, records, 8)


def _same_as_one_record_at_a_time(engines: list[tuple[sa.Engine, str]],
                                  records: list[Record], seed: int) -> None:
    (batched, batched_db), (single, single_db) = engines
    one = Sink(single, f"single-{seed}")
    for r in records:
        one.apply([r])
    with batched.connect() as a, single.connect() as b:
        differences = [d for d in Comparison(a, batched_db, b, single_db)
                       if d.table != "applied_offsets"]
    assert differences == []
    with batched.connect() as conn:  # the history did exercise what it should
        states = dict(conn.exec_driver_sql(
            "SELECT state, COUNT(*) FROM jobs GROUP BY state").all())
        assert states.get("Success", 0) > 50 and states.get("Cancelled", 0) > 0
        assert conn.exec_driver_sql(
            "SELECT COUNT(*) FROM attempts WHERE reason = 'preempted'").scalar_one() > 0
        assert conn.exec_driver_sql(
            "SELECT SUM(resource_usage) FROM aggregated_batch_resources").scalar_one() > 0
        assert conn.exec_driver_sql(
            "SELECT COUNT(*) FROM batches WHERE state = 'complete'").scalar_one() == 4
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM completions_outbox").scalar_one() >= 4
        assert dict(conn.exec_driver_sql(
            "SELECT state, COUNT(*) FROM instances GROUP BY state").all()) == {
            "active": 3, "deleted": 1}
        assert conn.exec_driver_sql(
            "SELECT SUM(n) FROM event_rates WHERE kind = 'MJC'").scalar_one() > 50
        # batch 3 completed twice, once per update: one outbox row for each
        assert conn.exec_driver_sql(
            "SELECT n_jobs FROM completions_outbox WHERE batch_id = 3 AND job_group_id = 0 "
            "ORDER BY n_jobs").scalars().all() == [40, 42]


@pytest.mark.parametrize("seed", [4, 5])
def test_bunched_sjs_and_mjcs_project_as_single_ones(engines: list[tuple[sa.Engine, str]],
                                                    seed: int) -> None:
    (with_bunches, bunches_db), (with_singles, singles_db) = engines
    _empty(engines)
    singles = timed(history(seed))
    bunches = bunched(singles)
    sizes = [len(e.event.attempts) for e in bunches if isinstance(e.event, JobsScheduled)]
    assert max(sizes) > 1
    assert sum(sizes) == sum(isinstance(e.event, JobScheduled) for e in singles)
    mjcs = [len(e.event.attempts) for e in bunches if isinstance(e.event, JobsCompleted)]
    assert max(mjcs) > 1
    for engine, log in ((with_bunches, bunches), (with_singles, singles)):
        records = _records(log)
        sink = Sink(engine, f"sj-{seed}")
        for i in range(0, len(records), 300):
            sink.apply(records[i:i + 300])
    with with_bunches.connect() as a, with_singles.connect() as b:
        differences = [d for d in Comparison(a, bunches_db, b, singles_db)
                       if d.table != "applied_offsets"]  # fewer records: other offsets
    assert differences == []
    with with_bunches.connect() as conn:
        assert conn.exec_driver_sql(
            "SELECT SUM(n) FROM event_rates WHERE kind = 'SJ'").scalar_one() == sum(sizes)
