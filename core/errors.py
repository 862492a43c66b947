"""Domain errors: what a request did wrong, with the HTTP status the API reports for it.

The core raises these and nothing else for bad input; the web layer maps them to responses in
one place (``status`` and ``message``, the latter being the body clients match on). Errors of the
infrastructure (broker, database) are not domain errors and never subclass :class:`DomainError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class DomainError(Exception):
    """A request the domain refuses. ``message`` is the text the client sees."""

    status: ClassVar[int] = 400

    def __init__(self, message: str) -> None:
        """Create the error.

        Args:
            message: What is wrong, worded for the client (tests match on it).

        """
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        """Class name and message, for logs and test output."""
        return f"{type(self).__name__}({self.message!r})"


class BadRequest(DomainError):
    """The request is malformed or asks for something impossible (HTTP 400)."""

    status: ClassVar[int] = 400


class Forbidden(DomainError):
    """The caller may not do this, e.g. with this billing project (HTTP 403)."""

    status: ClassVar[int] = 403


class NotFound(DomainError):
    """The thing named does not exist or is not visible to the caller (HTTP 404)."""

    status: ClassVar[int] = 404


class Unavailable(DomainError):
    """The service refuses the request for now (frozen by an operator): HTTP 503."""

    status: ClassVar[int] = 503



LISTED = 10
"""How many values an error message lists before it only counts the rest."""


def listed(values: Sequence[int], limit: int = LISTED) -> str:
    """``values`` for an error message, as a list (``[0, 5]``).

    Past ``limit``, the first ``limit`` and an ellipsis: a bunch can hold 1,024 bad ids, and a
    message of 1,024 numbers hides what it says. :func:`counted` says how many there were.
    """
    if len(values) <= limit:
        return str(list(values))
    return f"[{', '.join(map(str, values[:limit]))}, ...]"


def counted(values: Sequence[int], limit: int = LISTED) -> str:
    """`` (N in all)`` where :func:`listed` left values out, else nothing."""
    return f" ({len(values)} in all)" if len(values) > limit else ""


def reserved(noun: str, n: int) -> str:
    """What ids an update reserved, for an out-of-range message."""
    if n <= 0:
        return f"the update reserved no {noun}s"
    if n == 1:
        return f"the update reserved 1 {noun} (id 1)"
    return f"the update reserved {n} {noun}s (ids 1 to {n})"
