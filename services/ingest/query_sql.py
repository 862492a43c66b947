"""Compile parsed ``q`` filters (core.query_ast) into SQL over the projection, with keyset pages.

Every user-supplied value travels as a bound parameter; the only text spliced into the SQL is
column names and operators taken from fixed tables below, keyed by the AST's closed Literals.
The SQL is plain MariaDB 10.11 / MySQL 8 (no LATERAL, no JSON aggregates, no window functions).

Semantics follow the reference service:
- an attribute filter means "has attribute ``k`` whose value ...", so ``k != v`` needs ``k``;
- ``instance``, ``start_time``, ``end_time`` and ``duration`` of a job hold if *some* attempt
  satisfies them; those of a batch are its creation and completion times;
- ``cost`` is ``SUM(usage * rate)`` over the job's (batch's) aggregated resources;
- ``=~``/``!~`` and bare keywords are substring matches (``LIKE`` with ``%``/``_`` escaped, so
  they are literal); comparisons follow the database collation (``utf8mb4_bin``: exact).

Pages: jobs ascend by id, ``limit`` a page, and a full page yields ``last_job_id`` (the client
stops on a page without it). Batches descend by id; the query asks for one row more than
``limit`` so ``last_batch_id`` appears only when another page exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Context, Decimal
from typing import Any, Final, TypeVar, assert_never

import sqlalchemy as sa

from core.projection.fold import NAME
from core.query_ast import (
    AttributeMatch,
    BatchFilter,
    BatchIdCompare,
    BatchStateIs,
    BatchStateWord,
    BillingProjectIs,
    CompareOp,
    CostCompare,
    DurationCompare,
    ExitCodeCompare,
    HasAttribute,
    InstanceCollectionMatch,
    InstanceMatch,
    JobFilter,
    JobIdCompare,
    JobStateIn,
    KeywordMatch,
    MatchOp,
    TimeCompare,
    UserIs,
)

PAGE_SIZE: Final = 50
ROOT_JOB_GROUP_ID: Final = 0

_COMPARE_SQL: Final[dict[CompareOp, str]] = {
    "=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">=",
}
_MATCH_SQL: Final[dict[MatchOp, str]] = {"=": "=", "!=": "<>", "=~": "LIKE", "!~": "NOT LIKE"}
# '!' rather than the default backslash: the same on both servers and under NO_BACKSLASH_ESCAPES.
_LIKE_ESCAPE: Final = "!"
_BATCH_STATE_SQL: Final[dict[BatchStateWord, str]] = {
    "open": "batches.state = 'open'",
    "closed": "batches.state <> 'open'",
    "complete": "batches.state = 'complete'",
    "running": "batches.state = 'running'",
    "cancelled": "EXISTS (SELECT 1 FROM batches_cancelled bc WHERE bc.batch_id = batches.id)",
    "failure": "COALESCE(counts.n_failed, 0) > 0",
    # complete is needed: a batch with no jobs yet has n_succeeded = n_jobs = 0
    "success": "(batches.state = 'complete' AND COALESCE(counts.n_succeeded, 0) = batches.n_jobs)",
}

# A job's usage is a column of its row (sql/015): an array of [resource, usage] pairs. Its
# resource names compare as bytes: JSON_TABLE's text has its own collation, not the table's.
_JOB_USAGE: Final = (
    "JSON_TABLE(jobs.resource_usage, '$[*]' COLUMNS (resource VARCHAR(100) PATH '$[0]', "
    "resource_usage BIGINT PATH '$[1]')) u JOIN resources r "
    "ON r.resource = CAST(u.resource AS BINARY)"
)
_JOB_COST: Final = f"(SELECT COALESCE(SUM(u.resource_usage * r.rate), 0) FROM {_JOB_USAGE})"
_BATCH_COST: Final = (
    "(SELECT COALESCE(SUM(abr.resource_usage * r.rate), 0) FROM aggregated_batch_resources abr "
    "JOIN resources r ON r.resource = abr.resource WHERE abr.batch_id = batches.id)"
)
_JOB_ATTR: Final = (
    "SELECT 1 FROM job_attributes ja WHERE ja.batch_id = jobs.batch_id AND ja.job_id = jobs.job_id"
)
# A job's name is a column of its row (sql/013): job_attributes holds its other attributes.
_NAME_KEY: Final = f"'{NAME}'"
_BATCH_ATTR: Final = "SELECT 1 FROM batch_attributes ba WHERE ba.batch_id = batches.id"
_ATTEMPT: Final = (
    "SELECT 1 FROM attempts a WHERE a.batch_id = jobs.batch_id AND a.job_id = jobs.job_id"
)

T = TypeVar("T")


def like_pattern(text: str) -> str:
    """A LIKE pattern matching ``text`` anywhere, its wildcards escaped with ``!``."""
    escaped = "".join(_LIKE_ESCAPE + c if c in "%_!" else c for c in text)
    return f"%{escaped}%"


def _sql_decimal(value: Decimal) -> Decimal:
    # Rates are DECIMAL(30, 18): more places cannot change a comparison, and a fixed-point
    # literal (never 1E+3) keeps MySQL comparing in DECIMAL arithmetic rather than double.
    return value.quantize(Decimal("1e-18"), context=Context(prec=60))


class _Params:
    """Collects bound parameters under unique names while conditions are built."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:
        name = f"q{len(self.values)}"
        self.values[name] = value
        return f":{name}"

    def match(self, column: str, op: MatchOp, value: str) -> str:
        if op in ("=~", "!~"):
            return f"{column} {_MATCH_SQL[op]} {self(like_pattern(value))} ESCAPE '{_LIKE_ESCAPE}'"
        return f"{column} {_MATCH_SQL[op]} {self(value)}"

    def compare(self, left: str, op: CompareOp, value: Any) -> str:
        return f"{left} {_COMPARE_SQL[op]} {self(value)}"


def _negated(condition: str, negate: bool) -> str:
    return f"(NOT ({condition}))" if negate else f"({condition})"


def _attribute(p: _Params, base: str, alias: str, f: AttributeMatch | HasAttribute) -> str:
    sql = f"EXISTS ({base} AND {alias}.attr_key = {p(f.key)}"
    if isinstance(f, AttributeMatch):
        sql += " AND " + p.match(f"{alias}.attr_value", f.op, f.value)
    return _negated(sql + ")", f.negate)


def _keyword(p: _Params, base: str, alias: str, f: KeywordMatch) -> str:
    op: MatchOp = "=" if f.exact else "=~"
    key = p.match(f"{alias}.attr_key", op, f.word)
    value = p.match(f"{alias}.attr_value", op, f.word)
    return f"EXISTS ({base} AND ({key} OR {value}))"


def job_condition(f: JobFilter, p: _Params) -> str:
    """One job filter as a SQL condition over ``jobs`` (parameters go to ``p``)."""
    match f:
        case AttributeMatch() | HasAttribute() if f.key == NAME:
            sql = "jobs.name IS NOT NULL"
            if isinstance(f, AttributeMatch):
                sql += " AND " + p.match("jobs.name", f.op, f.value)
            return _negated(sql, f.negate)
        case AttributeMatch() | HasAttribute():
            return _attribute(p, _JOB_ATTR, "ja", f)
        case KeywordMatch():
            op: MatchOp = "=" if f.exact else "=~"
            attempt = f"EXISTS ({_ATTEMPT} AND {p.match('a.instance_name', op, f.word)})"
            name = (f"(jobs.name IS NOT NULL AND ({p.match(_NAME_KEY, op, f.word)} "
                    f"OR {p.match('jobs.name', op, f.word)}))")
            return f"({_keyword(p, _JOB_ATTR, 'ja', f)} OR {name} OR {attempt})"
        case TimeCompare():
            column = "a.start_time_ms" if f.field == "start_time" else "a.end_time_ms"
            return f"EXISTS ({_ATTEMPT} AND {p.compare(column, f.op, f.epoch_ms)})"
        case DurationCompare():
            duration = "(a.end_time_ms - a.start_time_ms)"
            return f"EXISTS ({_ATTEMPT} AND {p.compare(duration, f.op, f.ms)})"
        case CostCompare():
            return f"({p.compare(_JOB_COST, f.op, _sql_decimal(f.value))})"
        case JobStateIn():
            states = ", ".join(p(state) for state in f.states)
            return _negated(f"jobs.state IN ({states})", f.negate)
        case JobIdCompare():
            return _negated(p.compare("jobs.job_id", f.op, f.value), f.negate)
        case ExitCodeCompare():
            if f.value is None:
                return "(jobs.exit_code IS NULL)" if f.op == "=" else "(jobs.exit_code IS NOT NULL)"
            return f"({p.compare('jobs.exit_code', f.op, f.value)})"
        case InstanceMatch():
            return f"EXISTS ({_ATTEMPT} AND {p.match('a.instance_name', f.op, f.value)})"
        case InstanceCollectionMatch():
            return f"({p.match('jobs.inst_coll', f.op, f.value)})"
        case _:
            assert_never(f)


def batch_condition(f: BatchFilter, p: _Params) -> str:
    """One batch filter as a SQL condition over ``batches`` and ``counts`` (root group)."""
    match f:
        case AttributeMatch() | HasAttribute():
            return _attribute(p, _BATCH_ATTR, "ba", f)
        case KeywordMatch():
            return _keyword(p, _BATCH_ATTR, "ba", f)
        case TimeCompare():
            column = {"start_time": "batches.time_created_ms",
                      "end_time": "batches.time_completed_ms"}[f.field]
            return f"({p.compare(column, f.op, f.epoch_ms)})"
        case DurationCompare():
            duration = "(batches.time_completed_ms - batches.time_created_ms)"
            return f"({p.compare(duration, f.op, f.ms)})"
        case CostCompare():
            return f"({p.compare(_BATCH_COST, f.op, _sql_decimal(f.value))})"
        case UserIs():
            return _negated(f"batches.user = {p(f.user)}", f.negate)
        case BillingProjectIs():
            return _negated(f"batches.billing_project = {p(f.billing_project)}", f.negate)
        case BatchStateIs():
            return _negated(_BATCH_STATE_SQL[f.state], f.negate)
        case BatchIdCompare():
            return f"({p.compare('batches.id', f.op, f.value)})"
        case _:
            assert_never(f)


JOB_COLUMNS: Final = (
    "jobs.batch_id, jobs.job_id, jobs.job_group_id, jobs.state, jobs.exit_code, "
    "jobs.always_run, jobs.cores_mcpu, jobs.inst_coll, jobs.n_attempts, jobs.start_time_ms, "
    "jobs.end_time_ms, batches.user, batches.billing_project, "
    "jobs.name, "
    f"{_JOB_COST} AS cost"
)


def job_list_query(
    batch_id: int, job_group_id: int, *, recursive: bool, filters: Sequence[JobFilter],
    last_job_id: int | None = None, limit: int = PAGE_SIZE,
) -> tuple[sa.TextClause, dict[str, Any]]:
    """One page of a job group's visible jobs, ascending by id, with :data:`JOB_COLUMNS`.

    ``recursive`` includes the jobs of every descendant group. Jobs of uncommitted updates and
    jobs of deleted batches are never listed. Returns the statement and its parameters.
    """
    p = _Params()
    where = [
        f"jobs.batch_id = {p(batch_id)}",
        "batch_updates.committed",
        "NOT batches.deleted",
    ]
    if not recursive:
        where.append(f"jobs.job_group_id = {p(job_group_id)}")
    elif job_group_id != ROOT_JOB_GROUP_ID:  # every group descends from the root
        where.append(
            "jobs.job_group_id IN (SELECT d.job_group_id FROM job_group_self_and_ancestors d "
            f"WHERE d.batch_id = {p(batch_id)} AND d.ancestor_id = {p(job_group_id)})"
        )
    if last_job_id is not None:
        where.append(f"jobs.job_id > {p(last_job_id)}")
    where.extend(job_condition(f, p) for f in filters)
    sql = (
        f"SELECT {JOB_COLUMNS} FROM jobs JOIN batches ON batches.id = jobs.batch_id "
        "JOIN batch_updates ON batch_updates.batch_id = jobs.batch_id "
        "AND batch_updates.update_id = jobs.update_id "
        f"WHERE {' AND '.join(where)} ORDER BY jobs.job_id LIMIT {p(_positive(limit))}"
    )
    return sa.text(sql), p.values


BATCH_COLUMNS: Final = (
    "batches.id, batches.user, batches.billing_project, batches.token, batches.state, "
    "batches.n_jobs, batches.attributes, batches.callback, batches.cancel_after_n_failures, "
    "batches.time_created_ms, batches.time_closed_ms, batches.time_completed_ms, "
    "COALESCE(counts.n_completed, 0) AS n_completed, "
    "COALESCE(counts.n_succeeded, 0) AS n_succeeded, "
    "COALESCE(counts.n_failed, 0) AS n_failed, COALESCE(counts.n_cancelled, 0) AS n_cancelled, "
    f"{_BATCH_STATE_SQL['cancelled']} AS cancelled, {_BATCH_COST} AS cost"
)


def batch_list_query(
    user: str, filters: Sequence[BatchFilter], *, last_batch_id: int | None = None,
    limit: int = PAGE_SIZE,
) -> tuple[sa.TextClause, dict[str, Any]]:
    """One page of the batches ``user`` may see, descending by id, with :data:`BATCH_COLUMNS`.

    A batch is visible when ``user`` is a member of its billing project and it is not deleted.
    Fetches ``limit + 1`` rows: pass them to :func:`batch_page`. Returns the statement and its
    parameters.
    """
    p = _Params()
    where = [
        "NOT batches.deleted",
        "EXISTS (SELECT 1 FROM billing_project_users bpu WHERE "
        f"bpu.billing_project = batches.billing_project AND bpu.user = {p(user)})",
    ]
    if last_batch_id is not None:
        where.append(f"batches.id < {p(last_batch_id)}")
    where.extend(batch_condition(f, p) for f in filters)
    sql = (
        f"SELECT {BATCH_COLUMNS} FROM batches LEFT JOIN job_group_job_counts counts "
        f"ON counts.batch_id = batches.id AND counts.job_group_id = {ROOT_JOB_GROUP_ID} "
        f"WHERE {' AND '.join(where)} ORDER BY batches.id DESC LIMIT {p(_positive(limit) + 1)}"
    )
    return sa.text(sql), p.values


def _positive(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"a page holds at least one row, not {limit}")
    return limit


def job_page(rows: Sequence[T], job_id: Callable[[T], int], limit: int = PAGE_SIZE,
             ) -> tuple[list[T], int | None]:
    """The rows of a job page and its ``last_job_id``: set only when the page is full."""
    page = list(rows[:limit])
    return page, (job_id(page[-1]) if len(page) == limit else None)


def batch_page(rows: Sequence[T], batch_id: Callable[[T], int], limit: int = PAGE_SIZE,
               ) -> tuple[list[T], int | None]:
    """The rows of a batch page (fetched with one extra) and its ``last_batch_id``: set only
    when another page follows."""
    page = list(rows[:limit])
    return page, (batch_id(page[-1]) if len(rows) > limit else None)


def batch_costs_query(batch_ids: Sequence[int]) -> tuple[sa.TextClause, dict[str, Any]]:
    """Usage and cost per resource of each batch of ``batch_ids`` (a page of the batch list).

    Rows: ``batch_id``, ``resource``, ``resource_usage``, ``cost``.
    """
    sql = (
        "SELECT u.batch_id, u.resource, u.resource_usage, u.resource_usage * r.rate AS cost "
        "FROM (SELECT batch_id, resource, SUM(resource_usage) AS resource_usage "
        "FROM aggregated_batch_resources WHERE batch_id IN :batch_ids "
        "GROUP BY batch_id, resource) u "
        "JOIN resources r ON r.resource = u.resource ORDER BY u.batch_id, u.resource"
    )
    statement = sa.text(sql).bindparams(sa.bindparam("batch_ids", expanding=True))
    return statement, {"batch_ids": list(batch_ids) or [-1]}


def cost_breakdown_query(batch_id: int, job_ids: Sequence[int] | None = None,
                         ) -> tuple[sa.TextClause, dict[str, Any]]:
    """Usage and cost per resource, per job of ``job_ids`` or (``None``) for the whole batch.

    Rows: ``job_id`` (NULL for the batch), ``resource``, ``resource_usage``, ``cost``.
    """
    if job_ids is None:
        sql = (
            "SELECT NULL AS job_id, u.resource, u.resource_usage, "
            "u.resource_usage * r.rate AS cost "
            "FROM (SELECT resource, SUM(resource_usage) AS resource_usage "
            "FROM aggregated_batch_resources WHERE batch_id = :batch_id GROUP BY resource) u "
            "JOIN resources r ON r.resource = u.resource ORDER BY u.resource"
        )
        return sa.text(sql), {"batch_id": batch_id}
    sql = (
        "SELECT jobs.job_id, r.resource, u.resource_usage, u.resource_usage * r.rate AS cost "
        f"FROM jobs JOIN {_JOB_USAGE} "
        "WHERE jobs.batch_id = :batch_id AND jobs.job_id IN :job_ids "
        "ORDER BY jobs.job_id, r.resource"
    )
    statement = sa.text(sql).bindparams(sa.bindparam("job_ids", expanding=True))
    return statement, {"batch_id": batch_id, "job_ids": list(job_ids) or [-1]}
