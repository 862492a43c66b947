"""The typed AST of the ``q`` query language: what a parsed job or batch query means.

A query is a list of filters that are ANDed. Nodes are frozen msgspec structs holding only
checked values (ints, Decimals, epoch milliseconds, closed sets of words), never SQL: the read
repositories compile them (``services/ingest/query_sql.py``).

Comparison operators are normalised: ``==`` becomes ``=``. ``negate`` records a v1 ``!`` prefix
(or a v2 ``!=`` on a field that only has equality), so the compiler wraps the whole condition in
``NOT``. That differs from a v2 ``!=`` on an attribute or instance, which keeps the existential
reading of the reference: ``k != v`` means "has attribute ``k`` with a value other than ``v``".
"""

from __future__ import annotations

from decimal import Decimal
from typing import Final, Literal, TypeAlias

import msgspec

from core.errors import BadRequest
from schemas.base import JobState


class QueryError(BadRequest, ValueError):
    """A ``q`` string that does not parse; the message is shown to the user (HTTP 400)."""


CompareOp: TypeAlias = Literal["=", "!=", "<", "<=", ">", ">="]
"""Operators of numeric, date, duration and cost fields (``==`` is read as ``=``)."""

MatchOp: TypeAlias = Literal["=", "!=", "=~", "!~"]
"""Operators of string fields: exact (``=``, ``!=``) or substring (``=~``, ``!~``)."""

BatchStateWord: TypeAlias = Literal[
    "open", "closed", "complete", "running", "cancelled", "failure", "success"
]

TimeField: TypeAlias = Literal["start_time", "end_time"]

JOB_STATE_WORDS: Final[dict[str, tuple[JobState, ...]]] = {
    "pending": ("Pending",),
    "ready": ("Ready",),
    "creating": ("Creating",),
    "running": ("Running",),
    "live": ("Ready", "Creating", "Running"),
    "cancelled": ("Cancelled",),
    "error": ("Error",),
    "failed": ("Failed",),
    "bad": ("Error", "Failed"),
    "success": ("Success",),
    "done": ("Cancelled", "Error", "Failed", "Success"),
}
"""The job state words of both versions and the job states each selects (as the reference)."""

BATCH_STATE_WORDS: Final[tuple[BatchStateWord, ...]] = (
    "open", "closed", "complete", "running", "cancelled", "failure", "success",
)


class _Node(msgspec.Struct, frozen=True, kw_only=True):
    pass


# Shared by job and batch queries.


class AttributeMatch(_Node, frozen=True, kw_only=True):
    """Has attribute ``key`` whose value matches ``value`` under ``op``."""

    key: str
    op: MatchOp
    value: str
    negate: bool = False


class HasAttribute(_Node, frozen=True, kw_only=True):
    """Has an attribute named ``key`` (v1 ``has:key``)."""

    key: str
    negate: bool = False


class KeywordMatch(_Node, frozen=True, kw_only=True):
    """A lone v2 word: an attribute key or value (or, for jobs, an instance name) matching it.

    ``exact`` (written ``"word"``) asks for equality, a bare ``word`` for a substring.
    """

    word: str
    exact: bool


class TimeCompare(_Node, frozen=True, kw_only=True):
    """Jobs: some attempt started/ended ``op`` the time; batches: created/completed."""

    field: TimeField
    op: CompareOp
    epoch_ms: int


class DurationCompare(_Node, frozen=True, kw_only=True):
    """Jobs: some attempt ran ``op`` ``ms``; batches: completion minus creation."""

    op: CompareOp
    ms: int


class CostCompare(_Node, frozen=True, kw_only=True):
    """Total cost in USD compared with ``value``."""

    op: CompareOp
    value: Decimal


# Jobs only.


class JobStateIn(_Node, frozen=True, kw_only=True):
    """The job's state is one of ``states`` (the states of one state word)."""

    states: tuple[JobState, ...]
    negate: bool = False


class JobIdCompare(_Node, frozen=True, kw_only=True):
    """The job id compared with ``value``."""

    op: CompareOp
    value: int
    negate: bool = False


class ExitCodeCompare(_Node, frozen=True, kw_only=True):
    """The job's exit code compared with ``value``; ``None`` (``NULL``) allows only = and !=."""

    op: CompareOp
    value: int | None


class InstanceMatch(_Node, frozen=True, kw_only=True):
    """Some attempt of the job ran on an instance whose name matches ``value``."""

    op: MatchOp
    value: str


class InstanceCollectionMatch(_Node, frozen=True, kw_only=True):
    """The job's instance collection (pool or job-private) matches ``value``."""

    op: MatchOp
    value: str


# Batches only.


class UserIs(_Node, frozen=True, kw_only=True):
    """The batch was created by ``user``."""

    user: str
    negate: bool = False


class BillingProjectIs(_Node, frozen=True, kw_only=True):
    """The batch is billed to ``billing_project``."""

    billing_project: str
    negate: bool = False


class BatchStateIs(_Node, frozen=True, kw_only=True):
    """The batch is in ``state`` (see :data:`BATCH_STATE_WORDS`; a batch can be in several)."""

    state: BatchStateWord
    negate: bool = False


class BatchIdCompare(_Node, frozen=True, kw_only=True):
    """The batch id compared with ``value``."""

    op: CompareOp
    value: int


JobFilter: TypeAlias = (
    AttributeMatch | HasAttribute | KeywordMatch | TimeCompare | DurationCompare | CostCompare
    | JobStateIn | JobIdCompare | ExitCodeCompare | InstanceMatch | InstanceCollectionMatch
)
BatchFilter: TypeAlias = (
    AttributeMatch | HasAttribute | KeywordMatch | TimeCompare | DurationCompare | CostCompare
    | UserIs | BillingProjectIs | BatchStateIs | BatchIdCompare
)
AnyFilter: TypeAlias = JobFilter | BatchFilter
