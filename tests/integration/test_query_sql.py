"""Compiled ``q`` filters against real MariaDB: each filter kind selects the right rows, and
keyset pages page correctly. Rows are inserted directly into a freshly migrated database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from core.billing import usage_text
from core.query import parse_batch_query, parse_job_query
from core.query_ast import KeywordMatch, UserIs
from services.common.settings import DatabaseSettings
from services.ingest.query_sql import (
    batch_list_query,
    batch_page,
    cost_breakdown_query,
    job_list_query,
    job_page,
)

pytestmark = pytest.mark.integration

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
MIN = 60_000
ISO_T0 = "2024-01-01T00:00:00Z"


def _batch(id_: int, user: str, project: str, state: str = "running", *, n_jobs: int = 0,
           completed_ms: int | None = None, deleted: bool = False) -> dict[str, Any]:
    return {"id": id_, "user": user, "billing_project": project, "token": f"t{id_}",
            "state": state, "n_jobs": n_jobs, "time_created_ms": T0 + id_ * MIN,
            "time_completed_ms": completed_ms, "deleted": deleted}


def _job(batch_id: int, job_id: int, group: int = 0, state: str = "Success", *,
         inst_coll: str = "standard", exit_code: int | None = None,
         committed: bool = True) -> dict[str, Any]:
    # Update 1 of every batch is committed, update 2 is not (see UPDATES).
    return {"batch_id": batch_id, "job_id": job_id, "update_id": 1 if committed else 2,
            "job_group_id": group, "state": state, "cores_mcpu": 1000, "inst_coll": inst_coll,
            "exit_code": exit_code}


BATCHES = [
    _batch(1, "alice", "p1", n_jobs=55),
    _batch(2, "alice", "p1", n_jobs=6),
    _batch(10, "alice", "p1", "open"),
    _batch(11, "alice", "p1", n_jobs=3),
    _batch(12, "bob", "p1", "complete", n_jobs=2, completed_ms=T0 + 12 * MIN + 30_000),
    _batch(13, "bob", "p2", "complete", n_jobs=2, completed_ms=T0 + 14 * MIN),
    _batch(14, "alice", "p1", "complete", deleted=True),
    _batch(15, "alice", "p1", "complete", completed_ms=T0 + 16 * MIN),
    *[_batch(i, "dave", "p3") for i in range(100, 160)],
]
MEMBERS = [("p1", "alice"), ("p1", "bob"), ("p2", "bob"), ("p3", "dave")]
BATCH_ATTRIBUTES = [(10, "name", "b-open"), (11, "name", "b-running"), (11, "team", "gen")]
COUNTS = [  # batch, n_succeeded, n_failed, n_cancelled
    (11, 0, 1, 0), (12, 2, 0, 0), (13, 1, 0, 1),
]
CANCELLED = [13]
GROUPS = [(1, 0, None), (1, 1, 0), (2, 0, None), (2, 1, 0), (2, 2, 1)]  # batch, group, parent
CLOSURE = [  # batch, group, ancestor, level
    (1, 0, 0, 0), (1, 1, 1, 0), (1, 1, 0, 1),
    (2, 0, 0, 0), (2, 1, 1, 0), (2, 1, 0, 1), (2, 2, 2, 0), (2, 2, 1, 1), (2, 2, 0, 2),
]
JOBS = [
    # batch 1: pagination. 51 committed jobs in the root, one uncommitted, three in group 1.
    *[_job(1, j) for j in range(1, 52)],
    _job(1, 52, committed=False),
    *[_job(1, j, 1) for j in range(53, 56)],
    # batch 2: one of each kind of job.
    _job(2, 1, 0, "Running"),
    _job(2, 2, 1, "Success", inst_coll="highmem", exit_code=0),
    _job(2, 3, 2, "Failed", exit_code=1),
    _job(2, 4, 0, "Pending"),
    _job(2, 5, 0, "Cancelled", committed=False),
    _job(2, 6, 1, "Error", inst_coll="highmem"),
    _job(14, 1),  # in a deleted batch
]
UPDATES = [(b, u, u == 1) for b in (1, 2, 14) for u in (1, 2)]  # batch, update, committed
JOB_ATTRIBUTES = [
    (2, 1, "name", "alpha"), (2, 1, "team", "gen"), (2, 2, "name", "beta"),
    (2, 3, "name", "gamma_1"), (2, 3, "team", "genomics"), (2, 4, "name", "del%ta"),
    (2, 5, "name", "alpha"), (2, 6, "name", "eps"),
]
ATTEMPTS = [  # batch, job, attempt, instance, start, end
    (2, 1, "a1", "inst-a", T0, None),
    (2, 2, "a1", "inst-b", T0, T0 + 10_000),
    (2, 3, "a1", "inst-a", T0 + 60 * MIN, T0 + 60 * MIN + 2_000),
    (2, 3, "a2", "inst-c", T0 + 120 * MIN, T0 + 121 * MIN),
    (2, 5, "a1", "inst-z", T0, T0 + 1_000),
    (2, 6, "a1", "inst-b", None, None),
]
RESOURCES = [("compute/n1/1", "compute/n1", "1", "0.001"), ("memory/n1/1", "memory/n1", "1",
                                                          "0.0001")]
JOB_USAGE = [(2, 2, "compute/n1/1", 1000), (2, 3, "compute/n1/1", 4000),
             (2, 3, "memory/n1/1", 10_000)]
BATCH_USAGE = [  # tokenized: the cost is the sum over tokens
    (12, "compute/n1/1", 0, 1000), (12, "compute/n1/1", 1, 1000), (11, "memory/n1/1", 3, 5000),
]


def _insert(conn: sa.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    conn.execute(
        sa.text(f"INSERT INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join(':' + c for c in columns)})"),
        rows,
    )


def _rows(columns: str, tuples: list[tuple[Any, ...]], **extra: Any) -> list[dict[str, Any]]:
    names = columns.split()
    return [dict(zip(names, t, strict=True), **extra) for t in tuples]


@pytest.fixture(scope="module")
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    with engine.begin() as conn:
        _insert(conn, "batches", BATCHES)
        _insert(conn, "billing_project_users",
                _rows("billing_project user", MEMBERS, time_added_ms=T0))
        _insert(conn, "batch_attributes",
                _rows("batch_id attr_key attr_value", BATCH_ATTRIBUTES))
        _insert(conn, "job_group_job_counts", [
            {"batch_id": b, "job_group_id": 0, "n_succeeded": s, "n_failed": f,
             "n_cancelled": c, "n_completed": s + f + c} for b, s, f, c in COUNTS])
        _insert(conn, "batches_cancelled",
                [{"batch_id": b, "reason": "user", "time_cancelled_ms": T0} for b in CANCELLED])
        _insert(conn, "job_groups", [
            {"batch_id": b, "job_group_id": g, "parent_id": p, "depth": 0 if p is None else 1,
             "committed": True, "time_created_ms": T0} for b, g, p in GROUPS])
        _insert(conn, "job_group_self_and_ancestors",
                _rows("batch_id job_group_id ancestor_id level", CLOSURE))
        _insert(conn, "jobs", JOBS)
        _insert(conn, "batch_updates", [
            {"batch_id": b, "update_id": u, "token": f"u{b}-{u}", "start_job_id": 1,
             "n_jobs": 0, "start_job_group_id": 1, "n_job_groups": 0, "committed": c,
             "time_created_ms": T0} for b, u, c in UPDATES])
        # A job's name is a column of its row (sql/013), every other attribute a row.
        _insert(conn, "job_attributes", _rows("batch_id job_id attr_key attr_value",
                                              [a for a in JOB_ATTRIBUTES if a[2] != "name"]))
        conn.execute(sa.text("UPDATE jobs SET name = :v WHERE batch_id = :b AND job_id = :j"),
                     [{"b": b, "j": j, "v": v} for b, j, k, v in JOB_ATTRIBUTES if k == "name"])
        _insert(conn, "attempts", _rows(
            "batch_id job_id attempt_id instance_name start_time_ms end_time_ms", ATTEMPTS))
        _insert(conn, "resources",
                _rows("resource product version rate", RESOURCES, time_created_ms=T0))
        # A job's usage is a column of its row (sql/015).
        usage: dict[tuple[int, int], dict[str, int]] = {}
        for b, j, resource, amount in JOB_USAGE:
            usage.setdefault((b, j), {})[resource] = amount
        conn.execute(sa.text("UPDATE jobs SET resource_usage = :u WHERE batch_id = :b "
                             "AND job_id = :j"), [{"b": b, "j": j, "u": usage_text(u)}
                                                  for (b, j), u in usage.items()])
        _insert(conn, "aggregated_batch_resources",
                _rows("batch_id resource token resource_usage", BATCH_USAGE))
    yield engine
    engine.dispose()


def _job_ids(engine: sa.Engine, q: str, version: int, *, batch_id: int = 2, group: int = 0,
             recursive: bool = True, last_job_id: int | None = None) -> list[int]:
    filters = parse_job_query(q, version)  # type: ignore[arg-type]
    sql, params = job_list_query(batch_id, group, recursive=recursive, filters=filters,
                                 last_job_id=last_job_id)
    with engine.connect() as conn:
        return [row.job_id for row in conn.execute(sql, params)]


def _batch_ids(engine: sa.Engine, q: str | None, version: int, user: str = "alice",
               last_batch_id: int | None = None) -> list[int]:
    filters = parse_batch_query(q, version, user=user)  # type: ignore[arg-type]
    sql, params = batch_list_query(user, filters, last_batch_id=last_batch_id)
    with engine.connect() as conn:
        return [row.id for row in conn.execute(sql, params)]


JOB_CASES: list[tuple[int, str, list[int]]] = [
    (1, "", [1, 2, 3, 4, 6]),
    (1, "name=alpha", [1]),
    (1, "!name=alpha", [2, 3, 4, 6]),
    (1, "has:team", [1, 3]),
    (1, "!has:team", [2, 4, 6]),
    (1, "live", [1]),
    (1, "bad", [3, 6]),
    (1, "done", [2, 3, 6]),
    (1, "!done", [1, 4]),
    (1, "pending", [4]),
    (1, "cancelled", []),
    (1, "job_id=3", [3]),
    (1, "!job_id=3", [1, 2, 4, 6]),
    (1, "team=gen live", [1]),
    (2, "state = bad", [3, 6]),
    (2, "state != bad", [1, 2, 4]),
    (2, "job_id > 2", [3, 4, 6]),
    (2, "job_id <= 2", [1, 2]),
    (2, "exit_code = 0", [2]),
    (2, "exit_code != 0", [3]),
    (2, "exit_code >= 0", [2, 3]),
    (2, "exit_code = NULL", [1, 4, 6]),
    (2, "exit_code != NULL", [2, 3]),
    (2, "instance = inst-a", [1, 3]),
    (2, "instance != inst-a", [2, 3, 6]),
    (2, "instance =~ inst", [1, 2, 3, 6]),
    (2, "instance !~ -a", [2, 3, 6]),
    (2, "instance_collection = highmem", [2, 6]),
    (2, "instance_collection != standard", [2, 6]),
    (2, "instance_collection =~ mem", [2, 6]),
    (2, "instance_collection !~ mem", [1, 3, 4]),
    (2, "name = alpha", [1]),
    (2, "name != alpha", [2, 3, 4, 6]),
    (2, "name =~ amm", [3]),
    (2, "name !~ a", [6]),
    (2, "name =~ %", [4]),
    (2, "name =~ _", [3]),
    (2, "gen", [1, 3]),
    (1, "has:name", [1, 2, 3, 4, 6]),
    (1, "!has:name", []),
    (2, "alpha", [1]),  # a keyword matches names like any other attribute's key or value
    (2, "amm", [3]),
    (2, '"alpha"', [1]),
    (2, '"alph"', []),
    (2, '"name"', [1, 2, 3, 4, 6]),
    (2, "nam", [1, 2, 3, 4, 6]),
    (1, "!name=alpha has:team", [3]),
    (2, '"gen"', [1]),
    (2, "team", [1, 3]),
    (2, "inst-c", [3]),
    (2, '"inst-b"', [2, 6]),
    (2, "zzz", []),
    (2, "start_time >= 2024-01-01T00:30:00Z", [3]),
    (2, "start_time < 2024-01-01T00:30:00Z", [1, 2]),
    (2, "end_time <= 2024-01-01T00:00:10Z", [2]),
    (2, "duration > 30", [3]),
    (2, "duration < 5", [3]),
    (2, "duration = 10", [2]),
    (2, "duration >= 2", [2, 3]),
    (2, "cost > 2", [3]),
    (2, "cost = 1", [2]),
    (2, "cost >= $1", [2, 3]),
    (2, "cost < 0.5", [1, 4, 6]),
    (2, "state = live\nname = alpha", [1]),
]


@pytest.mark.parametrize(("version", "q", "expected"), JOB_CASES,
                         ids=[f"v{v}-{q!r}" for v, q, _ in JOB_CASES])
def test_job_filters(engine: sa.Engine, version: int, q: str, expected: list[int]) -> None:
    assert _job_ids(engine, q, version) == expected


@pytest.mark.parametrize(
    ("group", "recursive", "expected"),
    [(0, False, [1, 4]), (0, True, [1, 2, 3, 4, 6]), (1, False, [2, 6]), (1, True, [2, 3, 6]),
     (2, True, [3]), (2, False, [3]), (7, True, [])],
    ids=lambda v: repr(v),
)
def test_job_groups(engine: sa.Engine, group: int, recursive: bool, expected: list[int]) -> None:
    assert _job_ids(engine, "", 1, group=group, recursive=recursive) == expected


def test_job_row_columns(engine: sa.Engine) -> None:
    sql, params = job_list_query(2, 0, recursive=True, filters=parse_job_query("job_id=3", 1))
    with engine.connect() as conn:
        (row,) = conn.execute(sql, params).mappings()
    assert row["name"] == "gamma_1"
    assert (row["user"], row["billing_project"], row["state"]) == ("alice", "p1", "Failed")
    assert row["cost"] == 5
    assert row["exit_code"] == 1


def test_jobs_without_a_name(engine: sa.Engine) -> None:
    assert _job_ids(engine, "has:name", 1, batch_id=1) == []
    assert _job_ids(engine, "!has:name", 1, batch_id=1, last_job_id=50) == [51, 53, 54, 55]
    assert _job_ids(engine, "name", 2, batch_id=1) == []
    sql, params = job_list_query(1, 0, recursive=True, filters=[], last_job_id=50)
    with engine.connect() as conn:
        assert {row["name"] for row in conn.execute(sql, params).mappings()} == {None}


def test_jobs_of_deleted_batches_are_invisible(engine: sa.Engine) -> None:
    assert _job_ids(engine, "", 1, batch_id=14) == []


def test_job_pages(engine: sa.Engine) -> None:
    def page(last: int | None, recursive: bool) -> tuple[list[int], int | None]:
        ids = _job_ids(engine, "", 1, batch_id=1, recursive=recursive, last_job_id=last)
        return job_page(ids, lambda j: j)

    first, last = page(None, False)
    assert first == list(range(1, 51)) and last == 50
    assert page(last, False) == ([51], None)  # 51 visible jobs: 50 + 1; job 52 is uncommitted

    first, last = page(None, True)
    assert first == list(range(1, 51)) and last == 50
    assert page(last, True) == ([51, 53, 54, 55], None)


def test_a_full_last_page_still_yields_last_job_id(engine: sa.Engine) -> None:
    sql, params = job_list_query(1, 0, recursive=False, filters=[], last_job_id=1)
    with engine.connect() as conn:
        ids = [row.job_id for row in conn.execute(sql, params)]
    assert job_page(ids, lambda j: j) == (list(range(2, 52)), 51)
    assert _job_ids(engine, "", 1, batch_id=1, recursive=False, last_job_id=51) == []


BATCH_CASES: list[tuple[int, str | None, str, list[int]]] = [
    (1, None, "alice", [15, 11, 10, 2, 1]),
    (1, "", "alice", [15, 12, 11, 10, 2, 1]),
    (1, "", "bob", [15, 13, 12, 11, 10, 2, 1]),
    (1, "", "carol", []),
    (1, "user:bob", "alice", [12]),
    (1, "!user:alice", "alice", [12]),
    (1, "billing_project:p2", "alice", []),
    (1, "billing_project:p2", "bob", [13]),
    (1, "!billing_project:p1", "bob", [13]),
    (1, "open", "alice", [10]),
    (1, "closed", "alice", [15, 12, 11, 2, 1]),
    (1, "running", "alice", [11, 2, 1]),
    (1, "complete", "bob", [15, 13, 12]),
    (1, "failure", "alice", [11]),
    (1, "success", "bob", [15, 12]),
    (1, "!success", "alice", [11, 10, 2, 1]),
    (1, "cancelled", "bob", [13]),
    (1, "!cancelled", "bob", [15, 12, 11, 10, 2, 1]),
    (1, "name=b-open", "alice", [10]),
    (1, "has:team", "alice", [11]),
    (1, "!has:name", "alice", [15, 12, 2, 1]),
    (2, "batch_id >= 11", "alice", [15, 12, 11]),
    (2, "batch_id < 10", "alice", [2, 1]),
    (2, "user = bob", "alice", [12]),
    (2, "user != alice", "bob", [13, 12]),
    (2, "billing_project = p2", "bob", [13]),
    (2, "state = failure", "alice", [11]),
    (2, "state != closed", "alice", [10]),
    (2, "state = cancelled", "bob", [13]),
    (2, "start_time > 2024-01-01T00:11:00Z", "alice", [15, 12]),
    (2, "end_time <= 2024-01-01T00:12:30Z", "alice", [12]),
    (2, "end_time > 2024-01-01T00:13:00Z", "bob", [15, 13]),
    (2, "duration = 30", "alice", [12]),
    (2, "duration > 40", "alice", [15]),
    (2, "cost > 1", "alice", [12]),
    (2, "cost = 0.5", "alice", [11]),
    (2, "cost < $0.1", "alice", [15, 10, 2, 1]),
    (2, "gen", "alice", [11]),
    (2, '"b-open"', "alice", [10]),
    (2, "b-", "alice", [11, 10]),
    (2, "name", "alice", [11, 10]),
    (2, "team =~ ge", "alice", [11]),
    (2, "name != b-open", "alice", [11]),
    (2, "state = complete\nuser = alice", "alice", [15]),
]


@pytest.mark.parametrize(("version", "q", "user", "expected"), BATCH_CASES,
                         ids=[f"v{v}-{q!r}-{u}" for v, q, u, _ in BATCH_CASES])
def test_batch_filters(engine: sa.Engine, version: int, q: str | None, user: str,
                       expected: list[int]) -> None:
    assert _batch_ids(engine, q, version, user) == expected


def test_batch_row_columns(engine: sa.Engine) -> None:
    sql, params = batch_list_query("bob", parse_batch_query("batch_id = 13", 2, user="bob"))
    with engine.connect() as conn:
        (row,) = conn.execute(sql, params).mappings()
    assert (row["n_succeeded"], row["n_cancelled"], row["n_completed"]) == (1, 1, 2)
    assert row["cancelled"] == 1
    assert row["cost"] == 0


def test_batch_pages(engine: sa.Engine) -> None:
    first, last = batch_page(_batch_ids(engine, "", 1, "dave"), lambda b: b)
    assert first == list(range(159, 109, -1)) and last == 110
    rest, last = batch_page(_batch_ids(engine, "", 1, "dave", last_batch_id=last), lambda b: b)
    assert rest == list(range(109, 99, -1)) and last is None


def test_cost_breakdown(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        sql, params = cost_breakdown_query(2, [2, 3, 4])
        jobs = [(r.job_id, r.resource, r.cost) for r in conn.execute(sql, params)]
        sql, params = cost_breakdown_query(12)
        batch = [(r.resource, r.resource_usage, r.cost) for r in conn.execute(sql, params)]
        sql, params = cost_breakdown_query(2, [])
        assert list(conn.execute(sql, params)) == []
    assert jobs == [(2, "compute/n1/1", 1), (3, "compute/n1/1", 4), (3, "memory/n1/1", 1)]
    assert batch == [("compute/n1/1", 2000, 2)]


def test_user_text_is_bound_not_spliced(engine: sa.Engine) -> None:
    hostile = "x') OR 1=1 OR ('"
    sql, params = batch_list_query(hostile, [UserIs(user=hostile), KeywordMatch(word=hostile,
                                                                                exact=False)])
    assert hostile not in str(sql)
    with engine.connect() as conn:
        assert list(conn.execute(sql, params)) == []
