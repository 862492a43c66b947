"""The whole system for end-to-end tests: projector and ingest as processes on the real broker
and a fresh MariaDB database, a user with a token, and a billing project.

The official client runs in its own virtual environment (``.venv-hail``, made by
``make venv-hail``), as ../shared/hail-api.md prescribes; tests call it through
``tests/e2e/hail_scenarios.py`` and assert on the JSON it prints.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

from schemas.control import (
    BillingProjectCreated,
    BillingProjectMemberAdded,
    TokenIssued,
    UserCreated,
)
from schemas.events import AnyEvent
from services.common import procs
from services.common.log import Publisher, bootstrap_topics
from services.common.settings import DatabaseSettings, LogSettings, load_settings
from services.ingest.admin import new_token
from services.ingest.store import Store

REPO = Path(__file__).resolve().parents[2]
HAIL_PYTHON = REPO / ".venv-hail" / "bin" / "python"
SCENARIOS = Path(__file__).parent / "hail_scenarios.py"


@dataclass
class System:
    url: str
    token: str
    dev_token: str
    billing_project: str
    user: str
    log: LogSettings
    db: DatabaseSettings
    engine: sa.Engine

    def hail(self, scenario: str, *args: str, timeout: float = 240,
             developer: bool = False) -> Any:
        """Run a scenario with the official client; return what it printed (JSON)."""
        if not HAIL_PYTHON.exists():
            pytest.fail("the official client is not installed: run `make venv-hail`")
        proc = subprocess.run(
            [str(HAIL_PYTHON), str(SCENARIOS), scenario, self.url,
             self.dev_token if developer else self.token,
             self.billing_project, *args],
            capture_output=True, text=True, timeout=timeout,
            env={k: v for k, v in os.environ.items() if not k.startswith("HAIL_")})
        if proc.returncode != 0:
            raise AssertionError(f"scenario {scenario} failed ({proc.returncode}):\n"
                                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def append(self, events: list[AnyEvent]) -> None:
        async def go() -> None:
            async with Publisher(self.log) as pub:
                positions = await pub.publish_many(events)
            from services.common.settings import projector_consumer

            assert await Store(self.engine, projector_consumer(self.log)).wait_applied(
                positions, timeout_s=60)
        asyncio.run(go())


def _spawn(args: list[str], env: dict[str, str], log: Path) -> Any:
    return procs.spawn([sys.executable, *args], log_path=log, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def system(broker: str, migrated_db: DatabaseSettings,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    log = msgspec.structs.replace(load_settings().log, bootstrap_servers=broker, partitions=4,
                                  topic_prefix=f"e{uuid.uuid4().hex[:10]}-")
    asyncio.run(bootstrap_topics(log))
    tmp = tmp_path_factory.mktemp("system")
    port = procs.free_port()
    env = {"HS_KAFKA_BOOTSTRAP": broker, "HS_TOPIC_PREFIX": log.topic_prefix,
           "HS_KAFKA_PARTITIONS": "4", "HS_DB_NAME": migrated_db.name,
           "HS_DB_HOST": migrated_db.host, "HS_DB_PORT": str(migrated_db.port),
           "HS_INGEST_PORT": str(port)}
    projector = _spawn(["-m", "services.projector"], env, tmp / "projector.log")
    ingest = _spawn(["-m", "services.ingest", "--port", str(port)], env, tmp / "ingest.log")
    engine = sa.create_engine(migrated_db.url())
    try:
        procs.wait_for_port(port, timeout=60, proc=ingest, what="ingest")
        token, token_id, digest = new_token()
        dev_token, dev_token_id, dev_digest = new_token()
        sys_ = System(url=f"http://127.0.0.1:{port}", token=token, dev_token=dev_token,
                      billing_project="e2e", user="tester", log=log, db=migrated_db,
                      engine=engine)
        sys_.append([UserCreated(user="tester"),
                     TokenIssued(user="tester", token_id=token_id, token_sha256=digest),
                     UserCreated(user="boss", is_developer=True),
                     TokenIssued(user="boss", token_id=dev_token_id, token_sha256=dev_digest),
                     BillingProjectCreated(billing_project="e2e"),
                     BillingProjectMemberAdded(billing_project="e2e", user="tester")])
        yield sys_
    finally:
        for p in (ingest, projector):
            procs.terminate(p.pid)
            p.wait(timeout=10)
        engine.dispose()
