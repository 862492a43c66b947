"""Version 1 of the ``q`` language: whitespace-separated terms, each negated by a leading ``!``.

Jobs: ``k=v`` (attribute ``k`` equals ``v``; ``job_id=N`` compares the id), ``has:k`` and the
state words of :data:`core.query_ast.JOB_STATE_WORDS`. Batches: ``k=v``, ``has:k``, ``user:u``,
``billing_project:p`` and the words of :data:`core.query_ast.BATCH_STATE_WORDS`. A term is read
in that order, so ``has:a=b`` is an attribute named ``has:a``.
"""

from __future__ import annotations

from core.query_ast import (
    BATCH_STATE_WORDS,
    JOB_STATE_WORDS,
    AttributeMatch,
    BatchFilter,
    BatchStateIs,
    BillingProjectIs,
    HasAttribute,
    JobFilter,
    JobIdCompare,
    JobStateIn,
    QueryError,
    UserIs,
)
from core.query_v2 import parse_int


def _terms(q: str) -> list[tuple[str, bool]]:
    return [(raw[1:], True) if raw.startswith("!") else (raw, False) for raw in q.split()]


def _invalid(term: str) -> QueryError:
    return QueryError(f"Invalid search term: {term}.")


def parse_job_query_v1(q: str) -> list[JobFilter]:
    """Parse a v1 job query into filters (ANDed).

    Args:
        q: whitespace-separated terms.

    Returns:
        One filter per term, in order.

    Raises:
        QueryError: a term is not one of the forms above, or ``job_id=`` is not an int.

    """
    filters: list[JobFilter] = []
    for term, negate in _terms(q):
        if "=" in term:
            key, value = term.split("=", 1)
            if key == "job_id":
                filters.append(JobIdCompare(op="=", value=parse_int(value), negate=negate))
            else:
                filters.append(AttributeMatch(key=key, op="=", value=value, negate=negate))
        elif term.startswith("has:"):
            filters.append(HasAttribute(key=term[4:], negate=negate))
        elif term in JOB_STATE_WORDS:
            filters.append(JobStateIn(states=JOB_STATE_WORDS[term], negate=negate))
        else:
            raise _invalid(term)
    return filters


def parse_batch_query_v1(q: str) -> list[BatchFilter]:
    """Parse a v1 batch query into filters (ANDed).

    Args:
        q: whitespace-separated terms.

    Returns:
        One filter per term, in order.

    Raises:
        QueryError: a term is not one of the forms above.

    """
    filters: list[BatchFilter] = []
    for term, negate in _terms(q):
        if "=" in term:
            key, value = term.split("=", 1)
            filters.append(AttributeMatch(key=key, op="=", value=value, negate=negate))
        elif term.startswith("has:"):
            filters.append(HasAttribute(key=term[4:], negate=negate))
        elif term.startswith("user:"):
            filters.append(UserIs(user=term[5:], negate=negate))
        elif term.startswith("billing_project:"):
            filters.append(BillingProjectIs(billing_project=term[16:], negate=negate))
        else:
            state = next((word for word in BATCH_STATE_WORDS if word == term), None)
            if state is None:
                raise _invalid(term)
            filters.append(BatchStateIs(state=state, negate=negate))
    return filters
