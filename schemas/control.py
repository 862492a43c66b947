"""Control-plane events: users, tokens, billing projects, memberships, limits, resource rates.

All go to the control topic. Users and tokens are keyed by user name, billing-project events by
the project's name and rates by the resource, so each entity's history is totally ordered.
The scheduler's waiting reasons (why ready jobs are not scheduled) share the key ``scheduler``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

import msgspec

from schemas import topics
from schemas.base import Event


class ControlEvent(Event, frozen=True, kw_only=True):
    """An event on the control topic."""

    topic: ClassVar[str] = topics.CONTROL


class UserEvent(ControlEvent, frozen=True, kw_only=True):
    """An event about one user, keyed by the user's name."""

    user: str

    def key(self) -> str:
        """The user name."""
        return self.user


class UserCreated(UserEvent, frozen=True, kw_only=True, tag="user.created"):
    """A user now exists."""

    login_id: str | None = None
    is_developer: bool = False
    is_service_account: bool = False


class UserDeleted(UserEvent, frozen=True, kw_only=True, tag="user.deleted"):
    """A user can no longer authenticate; their batches stay readable to project members."""


class TokenIssued(UserEvent, frozen=True, kw_only=True, tag="token.issued"):
    """A bearer token was issued to ``user``. Only its SHA-256 is ever recorded."""

    token_id: str
    token_sha256: str
    expires_at_ms: int | None = None


class TokenRevoked(UserEvent, frozen=True, kw_only=True, tag="token.revoked"):
    """A token stops authenticating."""

    token_id: str


class BillingProjectEvent(ControlEvent, frozen=True, kw_only=True):
    """An event about one billing project, keyed by its name."""

    billing_project: str

    def key(self) -> str:
        """The billing project's name."""
        return self.billing_project


class BillingProjectCreated(BillingProjectEvent, frozen=True, kw_only=True,
                            tag="billing_project.created"):
    """A billing project now exists, open, with no members and no limit."""


class BillingProjectClosed(BillingProjectEvent, frozen=True, kw_only=True,
                           tag="billing_project.closed"):
    """A billing project accepts no new batches."""


class BillingProjectReopened(BillingProjectEvent, frozen=True, kw_only=True,
                             tag="billing_project.reopened"):
    """A closed billing project accepts batches again."""


class BillingProjectDeleted(BillingProjectEvent, frozen=True, kw_only=True,
                            tag="billing_project.deleted"):
    """A closed billing project is gone."""


class BillingProjectMemberAdded(BillingProjectEvent, frozen=True, kw_only=True,
                                tag="billing_project.member_added"):
    """``user`` may now submit to and read batches of the project."""

    user: str


class BillingProjectMemberRemoved(BillingProjectEvent, frozen=True, kw_only=True,
                                  tag="billing_project.member_removed"):
    """``user`` is no longer a member."""

    user: str


class BillingLimitSet(BillingProjectEvent, frozen=True, kw_only=True,
                      tag="billing_project.limit_set"):
    """The project's spending limit in USD (exact decimal); ``None`` removes it."""

    limit: Decimal | None


class ResourceRateSet(ControlEvent, frozen=True, kw_only=True, tag="resource.rate_set"):
    """The rate of a billed resource, in USD per unit of usage (exact decimal).

    ``resource`` is ``product/version`` (e.g. ``compute/n1-preemptible/1``); a new version is a
    new resource, so attempts already billed keep their rate.
    """

    resource: str
    rate: Decimal

    def key(self) -> str:
        """The resource name."""
        return self.resource


class ServiceFreezeSet(ControlEvent, frozen=True, kw_only=True, tag="service.freeze_set"):
    """An operator froze (or thawed) the service: while frozen, ingest refuses writes (503)."""

    frozen: bool
    reason: str | None = None

    def key(self) -> str:
        """All freezes share one key, so they are totally ordered."""
        return "service"


class WaitingReason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Why the ready jobs of one (user, inst_coll) queue, or one ready job, are not scheduled.

    Without ``batch_id``/``job_id`` the entry is the queue's; with them, one job's (the first
    blocked jobs of a queue, when the reason is the job's own: its regions or its size).
    ``reason`` is a code of :mod:`core.waiting` (``quota``, ``fair_share``, ``no_fit``,
    ``region``, ``queued``); None clears the entry (the queue or job is no longer blocked).
    ``since_ms`` is when the scheduler first published this reason for the entry.
    """

    user: str
    inst_coll: str
    batch_id: int | None = None
    job_id: int | None = None
    reason: str | None = None
    message: str = ""
    since_ms: int | None = None


class WaitingReasonsChanged(ControlEvent, frozen=True, kw_only=True,
                            tag="scheduler.waiting_reasons"):
    """The leader of ``epoch`` observed these reasons change (a fact; only changes are sent).

    The first event of an epoch replaces everything earlier epochs said (consumers drop their
    entries); events of an epoch older than one already seen are ignored, like stale SJs.
    All share one key, so they are totally ordered.
    """

    epoch: int
    entries: list[WaitingReason] = []

    def key(self) -> str:
        """All waiting reasons share one key, so they are totally ordered."""
        return "scheduler"
