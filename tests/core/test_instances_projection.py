"""Instance events and execution-event rates to row operations (core.projection.instances)."""

from __future__ import annotations

import msgspec
import pytest

from core.projection.instances import count_event, fold_election, fold_instance, minute_of
from core.projection.ops import Increment, InsertIgnore, UpdateIn, merge_increments
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptHeartbeat,
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
    InstanceEvent,
    InstanceRequested,
    SchedulerElected,
)

Row = dict[str, object]


def requested(name: str = "w1", cores: int = 4000) -> InstanceRequested:
    return InstanceRequested(instance_name=name, inst_coll="standard", machine_type="n1-4",
                             region="us-central1", cores_mcpu=cores, preemptible=True)


def rows_after(events: list[tuple[InstanceEvent, int]]) -> dict[str, Row]:
    """What applying each event's operations in order leaves, with the SQL's semantics: an
    insert keeps an existing row, a guarded update needs the row in one of its states."""
    rows: dict[str, Row] = {}
    for event, time_ms in events:
        for op in fold_instance(event, time_ms):
            match op:
                case InsertIgnore(table="instances", rows=new):
                    for r in new:
                        rows.setdefault(str(r["name"]), dict(r))
                case UpdateIn(table="instances", values=values, where=where, column="state",
                              values_in=states):
                    row = rows.get(str(where["name"]))
                    if row is not None and row["state"] in states:
                        row.update(values)
                case _:
                    raise AssertionError(f"unexpected operation {op!r}")
    return rows


def test_a_lifecycle_moves_through_every_state() -> None:
    life: list[tuple[InstanceEvent, int]] = [
        (requested(), 10),
        (InstanceCreated(instance_name="w1", inst_coll="standard"), 20),
        (InstanceActivated(instance_name="w1", address="10.0.0.1:5000", cores_mcpu=3500), 30)]
    row = rows_after(life)["w1"]
    assert (row["state"], row["cores_mcpu"], row["free_cores_mcpu"], row["address"]) == (
        "active", 3500, 3500, "10.0.0.1:5000")
    assert (row["time_created_ms"], row["time_activated_ms"], row["last_updated_ms"]) == (
        10, 30, 30)
    life.append((InstanceDeactivated(instance_name="w1", reason="idle"), 40))
    row = rows_after(life)["w1"]
    assert (row["state"], row["free_cores_mcpu"], row["reason"], row["time_deactivated_ms"]) == (
        "inactive", 0, "idle", 40)
    life.append((InstanceDeleted(instance_name="w1", reason="idle"), 50))
    row = rows_after(life)["w1"]
    assert (row["state"], row["time_deleted_ms"], row["last_updated_ms"]) == ("deleted", 50, 50)


def test_requested_is_pending_and_offers_nothing_yet() -> None:
    row = rows_after([(requested(cores=8000), 5)])["w1"]
    assert (row["state"], row["cores_mcpu"], row["free_cores_mcpu"], row["region"]) == (
        "pending", 8000, 0, "us-central1")


@pytest.mark.parametrize("late", [
    InstanceActivated(instance_name="w1", address="a", cores_mcpu=4000),
    InstanceDeactivated(instance_name="w1", reason="idle"),
    InstanceCreated(instance_name="w1", inst_coll="standard"),
    InstanceDeleted(instance_name="w1", reason="again"),
    requested(),
], ids=["activated", "deactivated", "created", "deleted-twice", "requested-again"])
def test_deleted_is_final(late: InstanceEvent) -> None:
    before = rows_after([(requested(), 1), (InstanceDeleted(instance_name="w1",
                                                            reason="create failed"), 2)])
    assert rows_after([(requested(), 1), (InstanceDeleted(instance_name="w1",
                                                          reason="create failed"), 2),
                       (late, 3)]) == before


def test_activation_before_creation_stays_active() -> None:
    """A local worker may activate before the scheduler publishes that it created it."""
    row = rows_after([(requested(), 1),
                      (InstanceActivated(instance_name="w1", address="a", cores_mcpu=4000), 2),
                      (InstanceCreated(instance_name="w1", inst_coll="standard"), 3)])["w1"]
    assert (row["state"], row["free_cores_mcpu"], row["last_updated_ms"]) == ("active", 4000, 3)


def test_events_of_an_instance_never_requested_change_nothing() -> None:
    assert rows_after([(InstanceActivated(instance_name="w9", address="a", cores_mcpu=1), 1),
                       (InstanceDeleted(instance_name="w9", reason="x"), 2)]) == {}


def test_long_reasons_fit_the_column() -> None:
    row = rows_after([(requested(), 1), (InstanceDeleted(instance_name="w1",
                                                         reason="x" * 500), 2)])["w1"]
    assert row["reason"] == "x" * 100


def test_an_election_is_one_idempotent_row() -> None:
    (op,) = fold_election(SchedulerElected(epoch=3, scheduler_id="s-a"), 77)
    assert op == InsertIgnore("scheduler_epochs", [
        {"epoch": 3, "scheduler_id": "s-a", "time_elected_ms": 77}])


SJ = JobScheduled(batch_id=1, job_id=1, attempt_id="a", instance_name="w", inst_coll="standard",
                  cores_mcpu=1000)
MJS = JobStarted(batch_id=1, job_id=1, attempt_id="a", instance_name="w", start_time_ms=1)
MJC = JobCompleted(batch_id=1, job_id=1, attempt_id="a", instance_name="w", state="Success",
                   end_time_ms=2)
CANCEL = JobCancelled(batch_id=1, job_id=2, reason="user")


@pytest.mark.parametrize(("event", "kind"), [
    (SJ, "SJ"), (MJS, "MJS"), (MJC, "MJC"), (CANCEL, "cancelled"),
    (AttemptHeartbeat(batch_id=1, job_id=1, attempt_id="a", instance_name="w",
                      rollup_time_ms=5), None),
], ids=["sj", "mjs", "mjc", "cancelled", "heartbeat-not-counted"])
def test_each_counted_kind_is_one_increment_in_its_minute(event: AnyEvent,
                                                          kind: str | None) -> None:
    ops = count_event(event, 3 * 60_000 + 59_999, token=7)
    expected = [] if kind is None else [
        Increment("event_rates", {"minute": 3, "kind": kind, "token": 7}, {"n": 1})]
    assert ops == expected


def test_counts_merge_per_minute_and_kind_and_duplicates_count() -> None:
    times = [0, 1_000, 59_999, 60_000, 120_001]
    ops = [op for t in times for op in count_event(SJ, t, 0)] + count_event(MJC, 60_001, 0)
    merged = {(op.key["minute"], op.key["kind"]): op.deltas["n"]
              for op in merge_increments(ops)}
    assert merged == {(0, "SJ"): 3, (1, "SJ"): 1, (2, "SJ"): 1, (1, "MJC"): 1}
    assert [minute_of(t) for t in (0, 59_999, 60_000)] == [0, 0, 1]


def test_an_mjc_that_reports_its_start_counts_as_a_start_and_a_completion() -> None:
    coalesced = msgspec.structs.replace(MJC, start_time_ms=1, start_reported=False)
    ops = count_event(coalesced, 60_000, token=2)
    assert [(op.key["minute"], op.key["kind"], op.key["token"], op.deltas["n"]) for op in ops] \
        == [(1, "MJS", 2, 1), (1, "MJC", 2, 1)]


def test_a_bunch_of_sjs_counts_as_its_attempts() -> None:
    bunch = JobsScheduled.of(SJ.batch_id, [SJ, msgspec.structs.replace(SJ, job_id=9)])
    ops = count_event(bunch, 60_000, token=4)
    assert [(op.key["minute"], op.key["kind"], op.key["token"], op.deltas["n"]) for op in ops] \
        == [(1, "SJ", 4, 2)]


def test_a_bunch_of_mjcs_counts_its_completions_and_the_starts_they_report() -> None:
    bunch = JobsCompleted.of([msgspec.structs.replace(MJC, job_id=j, start_time_ms=1,
                                                      start_reported=j != 2) for j in (1, 2, 3)])
    ops = count_event(bunch, 0, token=1)
    assert {op.key["kind"]: op.deltas["n"] for op in ops} == {"MJC": 3, "MJS": 1}
