"""First start of a local system: a developer user, a billing project, a token, default rates.

Runs after the services are up (the projector must apply the control events). When the user
already exists nothing happens: the token printed on the first start stays in
``<data dir>/dev-token``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import sqlalchemy as sa

from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from schemas.events import AnyEvent
from services.ingest.admin import append, known_rates, missing_default_rates, new_token
from services.stack.config import StackConfig

DEV_USER = "dev"
DEV_PROJECT = "dev"


def _user_exists(cfg: StackConfig) -> bool:
    engine = sa.create_engine(cfg.settings.db.url())
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT COUNT(*) FROM users WHERE name = :u"),
                                    {"u": DEV_USER}).scalar_one()) > 0
    finally:
        engine.dispose()


def client_instructions(url: str, token_file: str) -> str:
    """How to point the unmodified hailtop client at this system."""
    return (
        "Use the official client (hail==0.2.139) against it:\n"
        "    from hailtop.aiocloud.common import Session\n"
        "    from hailtop.batch_client import aioclient\n"
        f"    token = open('{token_file}').read().strip()\n"
        "    session = Session(credentials=aioclient.HailExplicitTokenCredentials(token))\n"
        f"    client = aioclient.BatchClient('{DEV_PROJECT}', url='{url}', session=session,"
        " headers={})\n"
        "(install it with `make venv-hail`: .venv-hail/bin/python)")


def ensure_dev_user(cfg: StackConfig, url: str, say: Callable[[str], None]) -> None:
    """Create the developer user and project once, and a token whenever none is saved."""
    token_file = cfg.data_dir / "dev-token"
    events: list[AnyEvent] = []
    if not _user_exists(cfg):
        events += [UserCreated(user=DEV_USER, is_developer=True),
                   BillingProjectCreated(billing_project=DEV_PROJECT),
                   BillingProjectMemberAdded(billing_project=DEV_PROJECT, user=DEV_USER)]
    rates = missing_default_rates(known_rates(cfg.settings))
    if rates:
        asyncio.run(append(cfg.settings, list(rates), wait_s=60))
        say(f"default rates set for {len(rates)} resources")
    if not events and token_file.exists():
        say(f"dev user: {DEV_USER!r}, token in {token_file}")
        return
    token, token_id, digest = new_token()
    events.append(TokenIssued(user=DEV_USER, token_id=token_id, token_sha256=digest))
    applied = asyncio.run(append(cfg.settings, events, wait_s=60))
    token_file.write_text(token + "\n")
    os.chmod(token_file, 0o600)
    say(f"dev user: {DEV_USER!r} (developer) in billing project {DEV_PROJECT!r}"
        + ("" if applied else " (the projector has not applied it yet)"))
    say(f"dev token: {token}  (saved in {token_file})")
    say(client_instructions(url, str(token_file)))
