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
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from services.ingest.admin import missing_default_rates, new_token
from services.ingest.store import Store
from services.scheduler.drivers.local import reap_instances

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
    env: dict[str, str] = field(default_factory=dict)
    tmp: Path = Path(".")
    schedulers: dict[str, Any] = field(default_factory=dict)
    scheduler_env: dict[str, str] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """The metrics server port of each service process (schedulers by name)."""

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

    def start_scheduler(self, name: str, extra: dict[str, str], *,
                        leader: bool = False) -> Any:
        """A scheduler replica as a process; with ``leader``, wait until it is elected."""
        self.metrics_ports[name] = procs.free_port()
        env = {**self.env, "HS_METRICS_PORT": str(self.metrics_ports[name]), **extra,
               "HS_SCHEDULER_ID": name}
        log = self.tmp / f"{name}.log"
        proc = _spawn(["-m", "services.scheduler"], env, log)
        self.schedulers[name] = proc
        deadline = time.monotonic() + 60
        while leader and "elected with epoch" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"scheduler {name} was not elected:\n{log.read_text()}")
            time.sleep(0.1)
        return proc

    def stop_schedulers(self) -> None:
        """Stop every replica, then every worker any of them started (SIGKILLed ones too)."""
        for proc in self.schedulers.values():
            procs.terminate(proc.pid)
            proc.wait(timeout=30)
        reap_instances(Path(self.env["HS_DATA_DIR"]))

    def append(self, events: list[AnyEvent]) -> None:
        async def go() -> None:
            async with Publisher(self.log) as pub:
                positions = await pub.publish_many(events)
            from services.common.settings import projector_consumer

            if not await Store(self.engine, projector_consumer(self.log)).wait_applied(
                    positions, timeout_s=60):
                raise AssertionError(
                    f"the projector did not apply {positions} within 60 s; its log ends:\n"
                    f"{_tail(self.tmp / 'projector.log')}")
        asyncio.run(go())


def _tail(path: Path, n: int = 60) -> str:
    """The last ``n`` lines of a service's log (what a failure report needs)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e:
        return f"(no log: {e})"


def get_json(system: System, path: str) -> Any:
    """GET an API path as the test user; the decoded JSON."""
    request = urllib.request.Request(f"{system.url}{path}",
                                     headers={"Authorization": f"Bearer {system.token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    """Poll ``check`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _spawn(args: list[str], env: dict[str, str], log: Path) -> Any:
    return procs.spawn([sys.executable, *args], log_path=log, env=env, cwd=REPO)


def start_system(broker: str, db: DatabaseSettings, tmp: Path, *,
                 scheduler_env: dict[str, str] | None = None,
                 completions_env: dict[str, str] | None = None) -> Iterator[System]:
    """Projector and ingest (plus a scheduler if ``scheduler_env`` is given, and the
    completions service if ``completions_env`` is) as processes."""
    log = msgspec.structs.replace(load_settings().log, bootstrap_servers=broker, partitions=4,
                                  topic_prefix=f"e{uuid.uuid4().hex[:10]}-")
    asyncio.run(bootstrap_topics(log))
    port = procs.free_port()
    env = {"HS_KAFKA_BOOTSTRAP": broker, "HS_TOPIC_PREFIX": log.topic_prefix,
           "HS_KAFKA_PARTITIONS": "4", "HS_DB_NAME": db.name,
           "HS_DB_HOST": db.host, "HS_DB_PORT": str(db.port),
           "HS_INGEST_PORT": str(port), "HS_DATA_DIR": str(tmp / "data")}
    metrics = {name: procs.free_port() for name in ("projector", "completions")}
    services = [_spawn(["-m", "services.projector"],
                       {**env, "HS_METRICS_PORT": str(metrics["projector"])},
                       tmp / "projector.log")]
    ingest = _spawn(["-m", "services.ingest", "--port", str(port)], env, tmp / "ingest.log")
    services.append(ingest)
    if completions_env is not None:
        services.append(_spawn(["-m", "services.completions"],
                               {**env, "HS_METRICS_PORT": str(metrics["completions"]),
                                **completions_env}, tmp / "completions.log"))
    engine = sa.create_engine(db.url())
    sys_ = None
    try:
        procs.wait_for_port(port, timeout=60, proc=ingest, what="ingest")
        token, token_id, digest = new_token()
        dev_token, dev_token_id, dev_digest = new_token()
        sys_ = System(url=f"http://127.0.0.1:{port}", token=token, dev_token=dev_token,
                      billing_project="e2e", user="tester", log=log, db=db,
                      engine=engine, env=env, tmp=tmp, metrics_ports=metrics)
        sys_.append([UserCreated(user="tester"),
                     TokenIssued(user="tester", token_id=token_id, token_sha256=digest),
                     UserCreated(user="boss", is_developer=True),
                     TokenIssued(user="boss", token_id=dev_token_id, token_sha256=dev_digest),
                     BillingProjectCreated(billing_project="e2e"),
                     BillingProjectMemberAdded(billing_project="e2e", user="tester"),
                     *missing_default_rates({})])
        if scheduler_env is not None:
            sys_.start_scheduler("scheduler-a", scheduler_env, leader=True)
        yield sys_
    finally:
        if sys_ is not None:
            sys_.stop_schedulers()
        for p in reversed(services):
            procs.terminate(p.pid)
            p.wait(timeout=10)
        engine.dispose()


@pytest.fixture(scope="module")
def system(broker: str, migrated_db: DatabaseSettings,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The system without a scheduler: submitted jobs stay Ready or Pending."""
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("system"))


SCHEDULER_ENV = {"HS_SCHEDULER_AUTOSCALE_S": "0.5", "HS_SCHEDULER_IDLE_S": "60",
                 "HS_SCHEDULER_MAX_INSTANCES": "2", "HS_SCHEDULER_WORKER_HEARTBEAT_S": "1",
                 "HS_SCHEDULER_REDELIVER_S": "3"}


@pytest.fixture(scope="module")
def running_system(broker: str, migrated_db: DatabaseSettings,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """The whole system: jobs run on local worker processes the scheduler starts."""
    yield from start_system(broker, migrated_db, tmp_path_factory.mktemp("running"),
                            scheduler_env=SCHEDULER_ENV)
