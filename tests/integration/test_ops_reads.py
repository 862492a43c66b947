"""The ops and spending read repositories over hand-written projection rows (real MariaDB)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from services.common.settings import DatabaseSettings
from services.ingest.ops import Lag, Ops, lag_rows
from services.ingest.spending import Spending
from services.ingest.store import Store, User

pytestmark = pytest.mark.integration

NOW = 10_000_000_000
MIN = 60_000


@pytest.fixture(scope="module")
def store(migrated_db: DatabaseSettings) -> Iterator[Store]:
    engine = sa.create_engine(migrated_db.url())
    rows = [
        # event_rates (tokenized): minute -1: 2 SJ over two tokens; -2: 1 MJS; -10: 1 MJS and
        # 1 MJC; -20: 5 MJC (outside both windows); this minute: 1 SJ
        "INSERT INTO event_rates (minute, kind, token, n) VALUES "
        f"({NOW // MIN - 1}, 'SJ', 0, 1), ({NOW // MIN - 1}, 'SJ', 3, 1), "
        f"({NOW // MIN - 2}, 'MJS', 1, 1), ({NOW // MIN - 10}, 'MJS', 0, 1), "
        f"({NOW // MIN - 10}, 'MJC', 2, 1), ({NOW // MIN - 20}, 'MJC', 0, 5), "
        f"({NOW // MIN}, 'SJ', 1, 1)",
        # attempts: (job, start, end): one running on w1, ended or never started on w2
        "INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, start_time_ms, "
        f"end_time_ms) VALUES (1, 1, 'a', 'w1', {NOW - 2 * MIN}, NULL), "
        f"(1, 2, 'b', 'w1', {NOW - 10 * MIN}, {NOW - 1 * MIN}), "
        f"(1, 3, 'c', 'w2', {NOW - 30 * MIN}, {NOW - 20 * MIN}), (1, 4, 'd', 'w2', NULL, NULL)",
        "INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, cores_mcpu, inst_coll) "
        "VALUES (1, 1, 1, 0, 2000, 'standard'), (1, 2, 1, 0, 1000, 'standard')",
        "INSERT INTO batches (id, user, billing_project, token, time_created_ms) VALUES "
        "(1, 'ann', 'p', 't1', 0), (2, 'bob', 'q', 't2', 0)",
        # tokenized counters: two tokens per (user, pool)
        "INSERT INTO user_inst_coll_resources (user, inst_coll, token, n_ready_jobs, "
        "ready_cores_mcpu, n_running_jobs, running_cores_mcpu) VALUES "
        "('ann', 'standard', 0, 1, 1000, 1, 2000), ('ann', 'standard', 3, 2, 500, 0, 0), "
        "('bob', 'standard', 1, 0, 0, 1, 1000), ('bob', 'highmem', 2, 4, 8000, 0, 0)",
        "INSERT INTO instances (name, inst_coll, machine_type, region, cores_mcpu, "
        "free_cores_mcpu, state, time_created_ms, last_updated_ms) VALUES "
        "('w1', 'standard', 'm', 'local', 4000, 1000, 'active', 0, 0), "
        "('w2', 'standard', 'm', 'local', 4000, 4000, 'active', 0, 0), "
        "('w3', 'standard', 'm', 'local', 4000, 4000, 'deleted', 0, 0)",
        # batch 2 cancelled at 50; batch 1's group 1 at 40 reached its child 2 at the same time
        "INSERT INTO batches_cancelled VALUES (2, 'user', 50)",
        "INSERT INTO job_groups (batch_id, job_group_id, parent_id, depth, time_created_ms) "
        "VALUES (1, 0, NULL, 0, 0), (1, 1, 0, 1, 0), (1, 2, 1, 2, 0)",
        "INSERT INTO job_groups_cancelled VALUES (1, 1, 'user', 40), (1, 2, 'user', 40)",
        "INSERT INTO callback_deliveries (idempotency_key, batch_id, job_group_id, url, status, "
        "attempts, last_error, time_created_ms) VALUES ('k1', 1, 0, 'http://x', 'pending', 2, "
        "'refused', 5), ('k2', 2, 0, 'http://y', 'delivered', 1, NULL, 3)",
        "INSERT INTO completions_outbox (batch_id, job_group_id, n_jobs, outcome, n_succeeded, "
        "n_failed, n_cancelled, time_completed_ms, published_ms) VALUES "
        "(1, 0, 2, 'success', 2, 0, 0, 7, NULL), (2, 0, 1, 'success', 1, 0, 0, 8, 9)",
        "INSERT INTO resources (resource, product, version, rate, time_created_ms) VALUES "
        "('compute/x/1', 'compute/x', '1', 0.5, 0)",
        "INSERT INTO aggregated_billing_project_user_resources_by_date (billing_project, user, "
        "usage_date, resource, token, resource_usage) VALUES "
        "('p', 'ann', '2026-01-02', 'compute/x/1', 0, 2), "
        "('p', 'ann', '2026-01-02', 'compute/x/1', 1, 4), "
        "('p', 'bob', '2026-01-02', 'compute/x/1', 0, 10), "
        "('p', 'ann', '2025-11-01', 'compute/x/1', 0, 100)",
    ]
    with engine.begin() as conn:
        for sql in rows:
            conn.execute(sa.text(sql))
    yield Store(engine, "projector")
    engine.dispose()


def test_rates_sum_the_tokens_of_each_window(store: Store) -> None:
    half = NOW // MIN * MIN + 30_000  # half a minute into the current minute
    rates = Ops(store, None).rates(now_ms=half)
    assert [(r.window_min, r.sj, r.mjs, r.mjc, r.count("cancelled")) for r in rates.windows] == [
        (5, 3, 1, 0, 0), (15, 3, 2, 1, 0)]
    assert rates.windows[1].per_min("MJS") == pytest.approx(2 / 14.5)
    assert rates.windows[0].per_min("SJ") == pytest.approx(3 / 4.5)


def test_cores_sum_the_tokens_per_pool_and_per_user(store: Store) -> None:
    ops = Ops(store, None)
    pools = {c.name: (c.n_ready, c.ready_cores, c.n_running, c.running_cores)
             for c in ops.cores_by("pool")}
    assert pools == {"highmem": (4, 8.0, 0, 0.0), "standard": (3, 1.5, 2, 3.0)}
    users = {c.name: (c.n_ready, c.ready_cores, c.n_running, c.running_cores)
             for c in ops.cores_by("user")}
    assert users == {"ann": (3, 1.5, 1, 2.0), "bob": (4, 8.0, 1, 1.0)}


def test_instances_by_state_and_the_busy_ones(store: Store) -> None:
    ops = Ops(store, None)
    live, deleted = ops.instances()
    assert [(i.inst_coll, i.state, i.n, i.cores, i.free_cores) for i in live] == [
        ("standard", "active", 2, 8.0, 5.0)]
    assert deleted == 1
    (busy,) = ops.busy_instances()  # w1 runs job 1; w2's attempts ended or never started
    assert (busy.inst_coll, busy.name, busy.n_running, busy.running_cores, busy.since_ms) == (
        "standard", "w1", 1, 2.0, NOW - 2 * MIN)


def test_cancellations_list_what_was_cancelled_not_each_descendant(store: Store) -> None:
    found = [(c.batch_id, c.job_group_id, c.user, c.time_cancelled_ms)
             for c in Ops(store, None).cancellations()]
    assert found == [(2, 0, "bob", 50), (1, 1, "ann", 40)]


def test_callbacks_and_unpublished_completions(store: Store) -> None:
    callbacks = Ops(store, None).callbacks()
    assert {(c.status, c.n) for c in callbacks.by_status} == {("pending", 1), ("delivered", 1)}
    (owed,) = callbacks.owed
    assert (owed.idempotency_key, owed.attempts, owed.last_error) == ("k1", 2, "refused")
    assert (callbacks.unpublished_completions, callbacks.oldest_unpublished_ms) == (1, 7)


def test_lag_counts_partitions_a_consumer_has_not_applied_yet() -> None:
    rows = lag_rows([("c", "batch-events", 0, 5, 1)], {("batch-events", 0): 9,
                                                       ("batch-events", 1): 3,
                                                       ("control-events", 0): 4})
    assert rows == [
        Lag(consumer="c", topic="batch-events", partition=0, next_offset=5, high_watermark=9,
            lag=4, updated_at_ms=1),
        Lag(consumer="c", topic="batch-events", partition=1, next_offset=0, high_watermark=3,
            lag=3, updated_at_ms=None)]


async def test_lag_without_a_broker_shows_the_stored_offsets(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO applied_offsets VALUES ('projector', 'batch-events', "
                             "0, 12, 5)"))
    report = await Ops(store, None).lag()
    assert report.error == "no broker configured"
    assert [(r.consumer, r.next_offset, r.lag) for r in report.rows] == [("projector", 12, None)]


@pytest.mark.parametrize(("user", "expected"), [
    (User("ann", False), [("2026-01-02", "p", "ann", 3.0)]),
    (User("boss", True), [("2026-01-02", "p", "ann", 3.0), ("2026-01-02", "p", "bob", 5.0)]),
], ids=["member-sees-own", "developer-sees-all"])
def test_spending_by_day_sums_tokens_within_the_window(
        store: Store, user: User, expected: list[tuple[str, str, str, float]]) -> None:
    rows = Spending(store).by_day(user, days=30, today=dt.date(2026, 1, 3))
    assert [(r.day, r.billing_project, r.user, r.cost) for r in rows] == expected
