r"""Version 2 of the ``q`` language: one statement per line.

Grammar (as the reference service reads it)::

    query      ::= "" | statement ("\n" statement)*
    statement  ::= word                  -- keyword: '"w"' exact, bare w partial
                 | left op right         -- spaces around op are optional
    op         ::= ">=" | "<=" | ">" | "<" | "!~" | "=~" | "!=" | "==" | "="

A line is padded around the first operator symbol it contains (in the order above), then split
on whitespace; anything but one or three words is ``could not parse term``. Jobs know the
fields ``instance``, ``instance_collection``, ``job_id``, ``exit_code``, ``state``,
``start_time``, ``end_time``, ``duration`` and ``cost``; batches know ``batch_id``, ``user``,
``billing_project``, ``state``, ``start_time``, ``end_time``, ``duration`` and ``cost``. Any
other left side names an attribute.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Final, TypeVar

from core.query_ast import (
    BATCH_STATE_WORDS,
    JOB_STATE_WORDS,
    AttributeMatch,
    BatchFilter,
    BatchIdCompare,
    BatchStateIs,
    BillingProjectIs,
    CompareOp,
    CostCompare,
    DurationCompare,
    ExitCodeCompare,
    InstanceCollectionMatch,
    InstanceMatch,
    JobFilter,
    JobIdCompare,
    JobStateIn,
    KeywordMatch,
    MatchOp,
    QueryError,
    TimeCompare,
    UserIs,
)

# Order matters: two-character symbols before their one-character prefixes.
OPERATOR_SYMBOLS: Final[tuple[str, ...]] = (">=", "<=", ">", "<", "!~", "=~", "!=", "==", "=")
_COMPARE: Final[dict[str, CompareOp]] = {
    ">=": ">=", "<=": "<=", ">": ">", "<": "<", "!=": "!=", "==": "=", "=": "=",
}
_MATCH: Final[dict[str, MatchOp]] = {"=": "=", "==": "=", "!=": "!=", "=~": "=~", "!~": "!~"}
_EXACT: Final[frozenset[str]] = frozenset({"=", "==", "!="})
_INT64: Final[int] = 2**63
# Bounds a float literal so seconds -> ms and money stay exact and fit BIGINT/DECIMAL columns.
_MAX_FLOAT: Final[Decimal] = Decimal(10) ** 12
_EPOCH: Final[dt.datetime] = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

T = TypeVar("T")
F = TypeVar("F")
"""A filter type: a job's or a batch's."""


def parse_int(word: str) -> int:
    """Parse a signed 64-bit integer, or raise ``expected int, but found``."""
    try:
        value = int(word)
    except ValueError:
        raise QueryError(f"expected int, but found {word}") from None
    if not -_INT64 <= value < _INT64:
        raise QueryError(f"expected int, but found {word}")
    return value


def parse_float(word: str) -> Decimal:
    """Parse a finite number (kept exact as a Decimal), or raise ``expected float, but found``."""
    try:
        value = Decimal(word)
    except (InvalidOperation, ValueError):
        raise QueryError(f"expected float, but found {word}") from None
    if not value.is_finite() or abs(value) > _MAX_FLOAT:
        raise QueryError(f"expected float, but found {word}")
    return value


def parse_seconds_as_ms(word: str) -> int:
    """Parse a duration in seconds into whole milliseconds, truncating as the reference does."""
    return int(parse_float(word) * 1000)


def parse_cost(word: str) -> Decimal:
    """Parse a cost in USD; leading ``$`` signs are allowed."""
    return parse_float(word.lstrip("$"))


def parse_date(word: str) -> int:
    """Parse an ISO 8601 date or time into epoch milliseconds (no zone means UTC)."""
    try:
        when = dt.datetime.fromisoformat(word)
    except ValueError:
        raise QueryError(f"expected date, but found {word}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - _EPOCH) // dt.timedelta(milliseconds=1)


def pad_operator(line: str) -> str:
    """Surround the first operator symbol found in ``line`` (all its occurrences) by spaces."""
    for symbol in OPERATOR_SYMBOLS:
        if symbol in line:
            return f" {symbol} ".join(part.strip() for part in line.split(symbol))
    return line


def _operator(symbol: str, allowed: dict[str, T], names: frozenset[str] | None = None) -> T:
    if symbol not in OPERATOR_SYMBOLS:
        raise QueryError(f"unknown operator {symbol}")
    choices = names if names is not None else frozenset(allowed)
    if symbol not in choices:
        listed = ", ".join(repr(s) for s in sorted(choices))
        raise QueryError(f'unexpected operator "{symbol}" expected one of {{{listed}}}')
    return allowed[symbol]


def compare_op(symbol: str) -> CompareOp:
    """The comparison operator written ``symbol`` (``= == != < <= > >=``)."""
    return _operator(symbol, _COMPARE)


def match_op(symbol: str) -> MatchOp:
    """The string-match operator written ``symbol`` (``= == != =~ !~``)."""
    return _operator(symbol, _MATCH)


def exact_negate(symbol: str) -> bool:
    """For equality-only fields: whether ``symbol`` (``= == !=``) negates."""
    return _operator(symbol, _MATCH, _EXACT) == "!="


def keyword(word: str) -> KeywordMatch:
    """A lone word: ``"w"`` matches exactly, bare ``w`` as a substring."""
    if word.startswith('"'):
        if len(word) < 3:
            raise QueryError(f"expected a string of minimum length 3. Found {word}")
        if not word.endswith('"'):
            raise QueryError("expected the last character of the string to be '\"'")
        return KeywordMatch(word=word[1:-1], exact=True)
    if word.endswith('"'):
        raise QueryError("expected the last character of the string to not be '\"'")
    return KeywordMatch(word=word, exact=False)


def _exit_code(op: str, right: str) -> ExitCodeCompare:
    if right.lower() == "null":
        return ExitCodeCompare(op="!=" if exact_negate(op) else "=", value=None)
    return ExitCodeCompare(op=compare_op(op), value=parse_int(right))


def _job_state(op: str, right: str) -> JobStateIn:
    negate = exact_negate(op)
    if right not in JOB_STATE_WORDS:
        raise QueryError(f'unknown state "{right}"')
    return JobStateIn(states=JOB_STATE_WORDS[right], negate=negate)


def _batch_state(op: str, right: str) -> BatchStateIs:
    negate = exact_negate(op)
    for word in BATCH_STATE_WORDS:
        if right == word:
            return BatchStateIs(state=word, negate=negate)
    raise QueryError(f'unknown state "{right}"')


def _start(op: str, right: str) -> TimeCompare:
    return TimeCompare(field="start_time", op=compare_op(op), epoch_ms=parse_date(right))


def _end(op: str, right: str) -> TimeCompare:
    return TimeCompare(field="end_time", op=compare_op(op), epoch_ms=parse_date(right))


def _duration(op: str, right: str) -> DurationCompare:
    return DurationCompare(op=compare_op(op), ms=parse_seconds_as_ms(right))


def _cost(op: str, right: str) -> CostCompare:
    return CostCompare(op=compare_op(op), value=parse_cost(right))


_JOB_FIELDS: Final[dict[str, Callable[[str, str], JobFilter]]] = {
    "instance": lambda op, right: InstanceMatch(op=match_op(op), value=right),
    "instance_collection": lambda op, right: InstanceCollectionMatch(op=match_op(op), value=right),
    "job_id": lambda op, right: JobIdCompare(op=compare_op(op), value=parse_int(right)),
    "exit_code": _exit_code,
    "state": _job_state,
    "start_time": _start,
    "end_time": _end,
    "duration": _duration,
    "cost": _cost,
}

_BATCH_FIELDS: Final[dict[str, Callable[[str, str], BatchFilter]]] = {
    "batch_id": lambda op, right: BatchIdCompare(op=compare_op(op), value=parse_int(right)),
    "user": lambda op, right: UserIs(user=right, negate=exact_negate(op)),
    "billing_project": (
        lambda op, right: BillingProjectIs(billing_project=right, negate=exact_negate(op))
    ),
    "state": _batch_state,
    "start_time": _start,
    "end_time": _end,
    "duration": _duration,
    "cost": _cost,
}


FIELD_NAMES: Final[frozenset[str]] = frozenset(_JOB_FIELDS) | frozenset(_BATCH_FIELDS)
"""Left sides with a meaning of their own; any other left side names an attribute."""


def _statements(q: str) -> list[list[str]]:
    """Each line of ``q`` split into one or three words."""
    stripped = q.strip()
    if not stripped:
        return []
    statements = []
    for line in stripped.split("\n"):
        padded = pad_operator(line)
        words = padded.split()
        if len(words) not in (1, 3):
            raise QueryError(f'could not parse term "{padded}"')
        statements.append(words)
    return statements


def _attribute(left: str, op: str, right: str) -> AttributeMatch:
    return AttributeMatch(key=left, op=match_op(op), value=right)


def parse_job_query_v2(q: str) -> list[JobFilter]:
    """Parse a v2 job query into filters (ANDed).

    Args:
        q: the query text, one statement per line.

    Returns:
        One filter per statement, in order.

    Raises:
        QueryError: a statement does not parse.

    """
    return _filters(q, _JOB_FIELDS, keyword, _attribute)


def parse_batch_query_v2(q: str) -> list[BatchFilter]:
    """Parse a v2 batch query into filters (ANDed).

    Args:
        q: the query text, one statement per line.

    Returns:
        One filter per statement, in order.

    Raises:
        QueryError: a statement does not parse.

    """
    return _filters(q, _BATCH_FIELDS, keyword, _attribute)


def _filters(q: str, fields: Mapping[str, Callable[[str, str], F]],
             by_keyword: Callable[[str], F], by_attribute: Callable[[str, str, str], F]
             ) -> list[F]:
    """One filter per statement of ``q``.

    A statement is a keyword alone, a known field's comparison, or else an attribute's.
    """
    filters: list[F] = []
    for words in _statements(q):
        if len(words) == 1:
            filters.append(by_keyword(words[0]))
            continue
        left, op, right = words
        field = fields.get(left)
        filters.append(field(op, right) if field else by_attribute(left, op, right))
    return filters
