"""``python -m services.ingest.admin``: users, tokens, billing projects, members, limits, rates.

Every command appends control events to the log (the projector makes them visible) and waits,
bounded, until they are applied. Tokens are random, shown once, and stored only as SHA-256.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from decimal import Decimal, InvalidOperation
from typing import Annotated

import sqlalchemy as sa
import typer

from core.billing import default_rates, newer_version, split_resource
from schemas.control import (
    BillingLimitSet,
    BillingProjectClosed,
    BillingProjectCreated,
    BillingProjectMemberAdded,
    BillingProjectMemberRemoved,
    BillingProjectReopened,
    ResourceRateSet,
    ServiceFreezeSet,
    TokenIssued,
    TokenRevoked,
    UserCreated,
)
from schemas.events import AnyEvent
from services.common.log import Publisher
from services.common.settings import Settings, load_settings, projector_consumer
from services.ingest.store import Store

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def hash_token(token: str) -> str:
    """The stored form of a bearer token."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """A fresh (token, token id, sha256) triple."""
    token = secrets.token_urlsafe(32)
    return token, secrets.token_hex(8), hash_token(token)


async def append(settings: Settings, events: list[AnyEvent], *, wait_s: float = 30.0) -> bool:
    """Append ``events`` and wait until the projector has applied them."""
    engine = sa.create_engine(settings.db.url())
    try:
        async with Publisher(settings.log) as pub:
            positions = await pub.publish_many(events)
        return await Store(engine, projector_consumer(settings.log)).wait_applied(
            positions, timeout_s=wait_s)
    finally:
        engine.dispose()


_RESOURCES = sa.text("SELECT resource, rate FROM resources ORDER BY resource")


def known_rates(settings: Settings) -> dict[str, Decimal]:
    """The rates the projection holds, per resource."""
    engine = sa.create_engine(settings.db.url())
    try:
        with engine.connect() as conn:
            return {str(r): Decimal(rate) for r, rate in conn.execute(_RESOURCES)}
    finally:
        engine.dispose()


def missing_default_rates(known: dict[str, Decimal]) -> list[ResourceRateSet]:
    """Events that set the default rate of every default resource not known yet."""
    return [ResourceRateSet(resource=r, rate=rate) for r, rate in sorted(default_rates().items())
            if r not in known]


def next_rate(known: dict[str, Decimal], product: str, rate: Decimal) -> ResourceRateSet:
    """A new version of ``product`` at ``rate`` (rates of existing versions never change)."""
    latest: str | None = None
    for resource in known:
        p, version = split_resource(resource)
        if p == product and newer_version(latest, version):
            latest = version
    if latest is not None and not latest.isdigit():
        raise typer.BadParameter(f"cannot number a version after {latest!r} of {product}")
    return ResourceRateSet(resource=f"{product}/{1 if latest is None else int(latest) + 1}",
                           rate=rate)


def _run(events: list[AnyEvent], done: str) -> None:
    applied = asyncio.run(append(load_settings(), events))
    typer.echo(done if applied else f"{done} (appended; the projector has not applied it yet)")


@app.command("create-user")
def create_user(name: str, developer: Annotated[bool, typer.Option()] = False,
                service_account: Annotated[bool, typer.Option()] = False) -> None:
    """Create a user."""
    _run([UserCreated(user=name, is_developer=developer, is_service_account=service_account)],
         f"created user {name}")


@app.command("issue-token")
def issue_token(user: str) -> None:
    """Issue a bearer token for USER and print it (it is not stored in clear anywhere)."""
    token, token_id, digest = new_token()
    asyncio.run(append(load_settings(), [TokenIssued(user=user, token_id=token_id,
                                                     token_sha256=digest)]))
    typer.echo(f"token id {token_id}")
    typer.echo(token)


@app.command("revoke-token")
def revoke_token(user: str, token_id: str) -> None:
    """Revoke a token by its id."""
    _run([TokenRevoked(user=user, token_id=token_id)], f"revoked {token_id}")


@app.command("create-billing-project")
def create_billing_project(name: str) -> None:
    """Create an open billing project."""
    _run([BillingProjectCreated(billing_project=name)], f"created billing project {name}")


@app.command("close-billing-project")
def close_billing_project(name: str) -> None:
    """Close a billing project (no new batches)."""
    _run([BillingProjectClosed(billing_project=name)], f"closed {name}")


@app.command("reopen-billing-project")
def reopen_billing_project(name: str) -> None:
    """Reopen a closed billing project."""
    _run([BillingProjectReopened(billing_project=name)], f"reopened {name}")


@app.command("add-member")
def add_member(billing_project: str, user: str) -> None:
    """Let USER submit to and read BILLING_PROJECT."""
    _run([BillingProjectMemberAdded(billing_project=billing_project, user=user)],
         f"added {user} to {billing_project}")


@app.command("remove-member")
def remove_member(billing_project: str, user: str) -> None:
    """Remove USER from BILLING_PROJECT."""
    _run([BillingProjectMemberRemoved(billing_project=billing_project, user=user)],
         f"removed {user} from {billing_project}")


@app.command("set-limit")
def set_limit(billing_project: str, limit: str) -> None:
    """Set the spending limit in USD ('none' removes it)."""
    try:
        value = None if limit.lower() == "none" else Decimal(limit)
    except InvalidOperation:
        raise typer.BadParameter(f"limit must be a number or 'none', not {limit!r}") from None
    if value is not None and value < 0:
        raise typer.BadParameter("limit must not be negative")
    _run([BillingLimitSet(billing_project=billing_project, limit=value)],
         f"limit of {billing_project} set to {value}")


@app.command("default-rates")
def set_default_rates() -> None:
    """Set the default rate of every default resource that has none yet."""
    events = missing_default_rates(known_rates(load_settings()))
    if not events:
        typer.echo("every default resource has a rate")
        return
    _run(list(events), f"set {len(events)} default rates")


@app.command("set-rate")
def set_rate(product: str, rate: str) -> None:
    """Bill new attempts of PRODUCT (e.g. compute/standard-preemptible) at RATE USD per unit*ms.

    The rate goes to a new version of the product; attempts already billed keep theirs.
    """
    try:
        value = Decimal(rate)
    except InvalidOperation:
        raise typer.BadParameter(f"rate must be a number, not {rate!r}") from None
    if not value.is_finite() or value < 0:
        raise typer.BadParameter("rate must be a non-negative number")
    if "/" in product and product.rsplit("/", 1)[1].isdigit():
        raise typer.BadParameter(f"name the product without its version: {product!r}")
    event = next_rate(known_rates(load_settings()), product, value)
    _run([event], f"{event.resource} billed at {value}")


@app.command()
def rates() -> None:
    """Print every resource and its rate."""
    for resource, value in known_rates(load_settings()).items():
        typer.echo(f"{resource}\t{value}")


@app.command()
def freeze(reason: Annotated[str, typer.Option(help="Why, for the log.")] = "") -> None:
    """Freeze the service: submissions get 503 until `unfreeze` (reads, cancels still work)."""
    _run([ServiceFreezeSet(frozen=True, reason=reason or None)], "frozen")


@app.command()
def unfreeze() -> None:
    """Accept submissions again."""
    _run([ServiceFreezeSet(frozen=False)], "unfrozen")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
