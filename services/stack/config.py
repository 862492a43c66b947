"""Stack-specific settings (ports, mode, data directory) on top of the shared service settings.

Port scheme: the broker listens on ``kafka_port`` (by default the port of ``HS_KAFKA_BOOTSTRAP``,
9092). SeaweedFS takes a block of 15 ports from ``seaweed_base_port`` (default 18300, away from
SeaweedFS's own defaults so a stray ``weed`` never collides with the stack):

    master base+0, volume +1, filer +2, s3 +3, admin +4, debug +5, metrics +6,
    gRPC: master +10, volume +11, filer +12, s3 +13, admin +14

Services take ports from ``service_base_port`` (default 18400) upwards: ingest +0 (its API and
``/metrics``); the metrics servers of the projector +10, the scheduler +11 and completions +12
(docs/metrics.md). Tests pick free blocks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from services.common.settings import (
    BUNCH_SLACK_ENV,
    LOCAL_BROKER_FETCH_MAX_WAIT_MS,
    LOCAL_BROKER_PARTITIONS,
    PROJECTOR_DB_NICE_ENV,
    PROJECTOR_NICE_ENV,
    LogSettings,
    Settings,
    bunch_slack,
    load_settings,
    parse_bool,
    pick_env,
    projector_db_nice,
    projector_nice,
)

Mode = Literal["durable", "memory"]

REPO_ROOT = Path(__file__).resolve().parents[2]

SEAWEED_PORTS = {"master": 0, "volume": 1, "filer": 2, "s3": 3, "admin": 4, "debug": 5,
                 "metrics": 6}
SEAWEED_GRPC_PORTS = {"master": 10, "volume": 11, "filer": 12, "s3": 13, "admin": 14}
SEAWEED_PORT_SPAN = 15
SERVICE_PORT_SPAN = 13
"""Ports from ``service_base_port`` up that the services take (the module docstring)."""


class StackSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the local stack runs: broker storage, ports and timeouts."""

    mode: Mode = "durable"
    # None: the port of HS_KAFKA_BOOTSTRAP.
    kafka_port: int | None = None
    seaweed_base_port: int = 18300
    service_base_port: int = 18400
    # Seconds to wait for each component to answer.
    start_timeout_s: float = 60.0
    # Whether `up` may apt-get install mariadb-server when MariaDB is missing.
    install_db: bool = True

    def seaweed_port(self, name: str) -> int:
        """The HTTP port of one SeaweedFS server (master, volume, filer, s3, ...)."""
        return self.seaweed_base_port + SEAWEED_PORTS[name]

    def seaweed_grpc_port(self, name: str) -> int:
        """The gRPC port of one SeaweedFS server."""
        return self.seaweed_base_port + SEAWEED_GRPC_PORTS[name]


LOCAL_WORKER_CORES = 48
"""Cores each worker of the one-machine stack announces (``HS_SCHEDULER_WORKER_CORES``
overrides; the scheduler's own default, 16, sizes cloud VMs). Local workers are processes
sharing this machine's cores, so their cores are slots: at 0.25 core a job, two workers hold 384
jobs at once, enough to cover a job's round trip (dispatch, the worker's linger, the broker's
fetch wait, the scheduler's round) at the 1,000 no-op jobs/s of issue 6. With 16 and the fetch
wait of 60 ms, the machine idled 16% of a run waiting (bench.ab, 3 pairs of 100,000 jobs); 32
covered that wait, 48 covers the 120 ms wait of
:data:`services.common.settings.LOCAL_BROKER_FETCH_MAX_WAIT_MS` (some 206 jobs were in flight
at 60 ms, slow hour)."""


LOCAL_PROJECTOR_NICE = 15
"""How much the one-machine stack lowers the projector's CPU priority (``HS_PROJECTOR_NICE``
overrides). The projector shares this machine's two cores with ingest and the client; a big
submission's bunches are answered once they are in the log, and the projection follows (at
most ``HS_INGEST_BUNCH_SLACK`` records behind). At nice 15 the projector yields the cores to
the request path and catches up after: the 1M-job submit's server part took 9.8-10.4 s in three
runs against 10.9-12.2 s in seven at normal priority (the batch visible 4.7-5.5 s after the
submit instead of 3.0-4.5 s), and end to end was no slower (bench.ab, two pairs).

The stack lowers as much the database server's threads that serve the projector's connections
(``HS_PROJECTOR_DB_NICE``, :mod:`services.common.dbnice`): the projector's inserts run there,
and are most of the projection's CPU.

Where the kernel groups processes by session (``/proc/sys/kernel/sched_autogroup_enabled``, on
by default in most distributions' kernels and on the machine these figures come from), a nice
value orders a process only against the processes of its own session, and every service of
this stack leads its own: there the projector's nice moves nothing between the services (two
busy loops on one core in two sessions, one at nice 19: half each), and its database threads'
nice orders them only against the server's other threads, ingest's queries among them.
Lowering the projector's session as a group (``/proc/PID/autogroup``), the jobs' below it,
cost end to end 13% more of the stack's CPU per job (docs/performance.md, 2026-12-02 from
15:17): not done."""


LOCAL_BUNCH_SLACK = 2048
"""How many records the one-machine stack lets the projector fall behind a job bunch before the
bunch's answer waits for it (``HS_INGEST_BUNCH_SLACK``; ingest's own default is
:data:`services.ingest.commands.BUNCH_SLACK`, 512). With 512, a 1M-job submission (977 bunches
of the official client) is answered only once the projector has applied about half of it, so
half the projection's CPU falls inside the submit however low its priority. With 2,048 and the
projector's database threads lowered too (above), the projection yields the machine to the
request path and catches up after. In a machine held to 0.8 of a core (a cgroup's CPU quota:
a slow hour's figures, ``bench.ab --cpu-quota``), seven pairs: the 1M submit took 16.9 and
18.6 s against 20.5 and 20.2 (lower in 7 of 7), the batch visible 4-6 s later after it; either
change alone showed no difference, and end to end at full speed neither did the two (see
docs/performance.md, "The submit when the machine is full")."""


def _mode(value: str) -> Mode:
    if value == "durable":
        return "durable"
    if value == "memory":
        return "memory"
    raise ValueError(f"expected durable or memory, got {value!r}")


_STACK_ENV = {
    "HS_STACK_MODE": ("mode", _mode),
    "HS_STACK_KAFKA_PORT": ("kafka_port", int),
    "HS_STACK_SEAWEED_BASE_PORT": ("seaweed_base_port", int),
    "HS_STACK_SERVICE_BASE_PORT": ("service_base_port", int),
    "HS_STACK_START_TIMEOUT_S": ("start_timeout_s", float),
    "HS_STACK_INSTALL_DB": ("install_db", parse_bool),
}


def load_stack_settings(env: Mapping[str, str] | None = None) -> StackSettings:
    """Read ``HS_STACK_*`` variables from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    return StackSettings(**pick_env(env, _STACK_ENV))  # type: ignore[arg-type]


def _bootstrap_port(bootstrap: str) -> int:
    first = bootstrap.split(",")[0].strip()
    _, _, port = first.rpartition(":")
    return int(port) if port.isdigit() else 9092


@dataclass(frozen=True)
class StackConfig:
    """Everything `up`, `down` and `status` need: shared settings, stack settings, paths."""

    settings: Settings
    stack: StackSettings
    data_dir: Path
    worker_cores: int = 0
    """Cores each local worker announces (0: :data:`LOCAL_WORKER_CORES`)."""
    projector_nice: int = LOCAL_PROJECTOR_NICE
    """How much the projector lowers its CPU priority (``HS_PROJECTOR_NICE``)."""
    projector_db_nice: int = LOCAL_PROJECTOR_NICE
    """How much it lowers its database server threads' (``HS_PROJECTOR_DB_NICE``)."""
    bunch_slack: int = LOCAL_BUNCH_SLACK
    """How far the projector may fall behind a job bunch's answer (``HS_INGEST_BUNCH_SLACK``)."""

    @property
    def kafka_port(self) -> int:
        if self.stack.kafka_port is not None:
            return self.stack.kafka_port
        return _bootstrap_port(self.settings.log.bootstrap_servers)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def seaweed_dir(self) -> Path:
        return self.data_dir / "seaweed"

    @property
    def state_path(self) -> Path:
        return self.data_dir / "stack.json"

    def log_path(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def client_env(self) -> dict[str, str]:
        """The variables a client (service, test, shell) needs to talk to this stack."""
        db = self.settings.db
        env = {
            "HS_KAFKA_BOOTSTRAP": self.bootstrap,
            "HS_DB_HOST": db.host,
            "HS_DB_PORT": str(db.port),
            "HS_DB_USER": db.user,
            "HS_DB_NAME": db.name,
            "HS_DATA_DIR": str(self.data_dir),
        }
        if db.password:
            env["HS_DB_PASSWORD"] = db.password
        if self.settings.log.topic_prefix:
            env["HS_TOPIC_PREFIX"] = self.settings.log.topic_prefix
        # The stack's broker is tansu: a short fetch wait, unless one was set explicitly.
        wait = self.settings.log.fetch_max_wait_ms
        if wait == LogSettings().fetch_max_wait_ms:
            wait = LOCAL_BROKER_FETCH_MAX_WAIT_MS
        env["HS_KAFKA_FETCH_MAX_WAIT_MS"] = str(wait)
        env["HS_SCHEDULER_WORKER_CORES"] = str(self.worker_cores or LOCAL_WORKER_CORES)
        env["HS_PROJECTOR_NICE"] = str(self.projector_nice)
        env["HS_PROJECTOR_DB_NICE"] = str(self.projector_db_nice)
        env["HS_INGEST_BUNCH_SLACK"] = str(self.bunch_slack)
        env["HS_KAFKA_PARTITIONS"] = str(self.settings.log.partitions)
        return env


def load_config(env: Mapping[str, str] | None = None, **overrides: object) -> StackConfig:
    """Shared settings plus stack settings, with non-None ``overrides`` (from CLI options)."""
    env = os.environ if env is None else env
    settings = load_settings(env)
    stack = load_stack_settings(env)
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        stack = msgspec.structs.replace(stack, **given)
    kafka_port = stack.kafka_port if stack.kafka_port is not None else _bootstrap_port(
        settings.log.bootstrap_servers)
    # The log settings the stack itself uses point at the broker it runs, with the local
    # broker's partition count unless one was asked for.
    partitions = (settings.log.partitions if "HS_KAFKA_PARTITIONS" in env
                  else LOCAL_BROKER_PARTITIONS)
    settings = msgspec.structs.replace(
        settings, log=msgspec.structs.replace(settings.log, partitions=partitions,
                                              bootstrap_servers=f"127.0.0.1:{kafka_port}"))
    # The default data directory is var/ in the repository, wherever the CLI runs from.
    data_dir = Path(env["HS_DATA_DIR"]) if "HS_DATA_DIR" in env else REPO_ROOT / "var"
    cores = env.get("HS_SCHEDULER_WORKER_CORES")
    try:
        worker_cores = int(cores) if cores else LOCAL_WORKER_CORES
    except ValueError:
        raise ValueError(f"HS_SCHEDULER_WORKER_CORES: not a number of cores: {cores!r}") from None
    nice = projector_nice(env) if env.get(PROJECTOR_NICE_ENV) else LOCAL_PROJECTOR_NICE
    db_nice = projector_db_nice(env) if env.get(PROJECTOR_DB_NICE_ENV) else nice
    raw_slack = env.get(BUNCH_SLACK_ENV)
    slack = bunch_slack(raw_slack) if raw_slack else LOCAL_BUNCH_SLACK
    return StackConfig(settings=settings, stack=stack, data_dir=data_dir.resolve(),
                       worker_cores=worker_cores, projector_nice=nice,
                       projector_db_nice=db_nice, bunch_slack=slack)
