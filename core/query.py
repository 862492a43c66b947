"""The ``q`` query language of job and batch listings: parse text into filters, and back.

Parsing is pure: :func:`parse_job_query` and :func:`parse_batch_query` return lists of the
frozen nodes of :mod:`core.query_ast` (ANDed), or raise :class:`QueryError` with the text the
user sees (HTTP 400). The read repositories compile filters into SQL; nothing here knows SQL.
Version 1 (whitespace-separated terms) is in :mod:`core.query_v1`, version 2 (one statement
per line) in :mod:`core.query_v2`. :func:`render_query` writes filters back as query text, so
a query can be shown, stored or round-tripped in tests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Literal, TypeAlias

from core.query_ast import (
    JOB_STATE_WORDS,
    AnyFilter,
    AttributeMatch,
    BatchFilter,
    BatchIdCompare,
    BatchStateIs,
    BillingProjectIs,
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
    QueryError,
    TimeCompare,
    UserIs,
)
from core.query_v1 import parse_batch_query_v1, parse_job_query_v1
from core.query_v2 import FIELD_NAMES, parse_batch_query_v2, parse_job_query_v2

__all__ = [
    "QueryError",
    "QueryVersion",
    "default_batch_query",
    "parse_batch_query",
    "parse_job_query",
    "render_query",
]

QueryVersion: TypeAlias = Literal[1, 2]


def parse_job_query(q: str, version: QueryVersion) -> list[JobFilter]:
    """Parse the ``q`` of a job listing.

    Args:
        q: the query text (empty: no filter).
        version: 1 or 2.

    Returns:
        The filters, to be ANDed.

    Raises:
        QueryError: the text does not parse, or the version is unknown.

    """
    if version == 1:
        return parse_job_query_v1(q)
    if version == 2:
        return parse_job_query_v2(q)
    raise QueryError(f"unknown query version {version}")


def default_batch_query(user: str) -> list[BatchFilter]:
    """The filters of a batch listing without ``q``: the user's own batches (``user:<me>``)."""
    return [UserIs(user=user)]


def parse_batch_query(q: str | None, version: QueryVersion, *, user: str) -> list[BatchFilter]:
    """Parse the ``q`` of a batch listing.

    Args:
        q: the query text; ``None`` (no ``q`` parameter) means :func:`default_batch_query`,
            while an empty string means no filter.
        version: 1 or 2.
        user: the requesting user, for the default query.

    Returns:
        The filters, to be ANDed (visibility is added by the caller, not here).

    Raises:
        QueryError: the text does not parse, or the version is unknown.

    """
    if q is None:
        return default_batch_query(user)
    if version == 1:
        return parse_batch_query_v1(q)
    if version == 2:
        return parse_batch_query_v2(q)
    raise QueryError(f"unknown query version {version}")


def _word(text: str) -> str:
    if not text or text != text.strip() or len(text.split()) != 1 or any(
        c in text for c in "<>=~\n"
    ):
        raise ValueError(f"{text!r} cannot be written as one word of a query")
    return text


def _iso(epoch_ms: int) -> str:
    when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=epoch_ms)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _state_word(states: tuple[str, ...]) -> str:
    return next(word for word, those in JOB_STATE_WORDS.items() if set(those) == set(states))


def _render_v1(f: AnyFilter) -> str:
    bang = "!" if getattr(f, "negate", False) else ""
    match f:
        case AttributeMatch(op="=") if f.key != "job_id" and not f.key.startswith("!"):
            return f"{bang}{_word(f.key)}={_word(f.value)}"
        case HasAttribute():
            return f"{bang}has:{_word(f.key)}"
        case JobStateIn():
            return bang + _state_word(f.states)
        case JobIdCompare(op="="):
            return f"{bang}job_id={f.value}"
        case UserIs():
            return f"{bang}user:{_word(f.user)}"
        case BillingProjectIs():
            return f"{bang}billing_project:{_word(f.billing_project)}"
        case BatchStateIs():
            return bang + f.state
    raise ValueError(f"{f!r} cannot be written in version 1")


def _eq(negate: bool) -> str:
    return "!=" if negate else "="


def _render_v2(f: AnyFilter) -> str:
    if getattr(f, "negate", False) and not isinstance(
        f, JobStateIn | UserIs | BillingProjectIs | BatchStateIs
    ):
        raise ValueError(f"{f!r} cannot be written in version 2")
    match f:
        case AttributeMatch() if f.key not in FIELD_NAMES:
            return f"{_word(f.key)} {f.op} {_word(f.value)}"
        case KeywordMatch(exact=True):
            return f'"{_word(f.word)}"'
        case KeywordMatch() if not f.word.startswith('"') and not f.word.endswith('"'):
            return _word(f.word)
        case TimeCompare():
            return f"{f.field} {f.op} {_iso(f.epoch_ms)}"
        case DurationCompare():
            return f"duration {f.op} {Decimal(f.ms).scaleb(-3):f}"
        case CostCompare():
            return f"cost {f.op} {f.value:f}"
        case JobStateIn():
            return f"state {_eq(f.negate)} {_state_word(f.states)}"
        case JobIdCompare():
            return f"job_id {f.op} {f.value}"
        case ExitCodeCompare():
            return f"exit_code {f.op} {'NULL' if f.value is None else f.value}"
        case InstanceMatch():
            return f"instance {f.op} {_word(f.value)}"
        case InstanceCollectionMatch():
            return f"instance_collection {f.op} {_word(f.value)}"
        case UserIs():
            return f"user {_eq(f.negate)} {_word(f.user)}"
        case BillingProjectIs():
            return f"billing_project {_eq(f.negate)} {_word(f.billing_project)}"
        case BatchStateIs():
            return f"state {_eq(f.negate)} {f.state}"
        case BatchIdCompare():
            return f"batch_id {f.op} {f.value}"
    raise ValueError(f"{f!r} cannot be written in version 2")


def render_query(filters: Sequence[AnyFilter], version: QueryVersion) -> str:
    """Write filters as query text that parses back to equal filters.

    Args:
        filters: filters of one kind (job or batch).
        version: 1 (terms joined by spaces) or 2 (statements joined by newlines).

    Returns:
        The query text.

    Raises:
        ValueError: a filter has no spelling in that version (``has:`` in v2, a negated
            attribute match in v2, a comparison in v1), or a value is not a single word free
            of operator characters.

    """
    if version == 1:
        return " ".join(_render_v1(f) for f in filters)
    return "\n".join(_render_v2(f) for f in filters)
