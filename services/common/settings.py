"""Settings for every service, read from the environment.

One struct, passed to constructors (STYLE: "constructors take a settings struct"). The same code
runs against the local broker (tansu) and MariaDB, or against Apache Kafka and MySQL 8: only these
values change. Every variable is prefixed ``HS_``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from schemas import topics

TOPIC_BATCH = topics.BATCH
TOPIC_CONTROL = topics.CONTROL
TOPIC_SCHEDULER = topics.SCHEDULER
TOPIC_COMPLETIONS = topics.COMPLETIONS
ALL_TOPICS = topics.ALL


LOCAL_BROKER_FETCH_MAX_WAIT_MS = 120
"""The fetch wait for the local broker (tansu), which answers a waiting fetch only when the
wait is over: measured here, an event reached a waiting consumer after about 205 ms with Kafka's
default of 500 and after about 4 ms with 20. Every fetch that finds nothing costs the broker a
walk of the partition's record batches, so a short wait is paid in CPU on every quiet topic:
against 25 (bench.ab, 3 pairs of 50,000 no-op jobs, together with 32 local worker cores and a
1 s MJS delay), 60 cut the broker's CPU per job by 58% and the scheduler's by 47%; against 60
(3 pairs one after the other at a slow hour, with 48 local worker cores instead of 32), 120
cut the broker's by 40%, the scheduler's by 24% and the projector's by 13%, the CPU per job by
9.9%, and ran 9.4% more jobs a second to the batch shown complete (higher in 3 of 3). A wait
costs at most this much latency per hop of a quiet consumer; under load fetches find records
and return at once."""


LOCAL_BROKER_PARTITIONS = 2
"""Partitions per topic of the one-machine stack (``HS_KAFKA_PARTITIONS`` overrides). The local
broker (tansu) reads every partition of a fetch on each poll, waiting or not: idle, the stack's
consumers cost it 22% of a core with 8 partitions per topic and 8% with 2 (measured). On one
machine one projector applies every partition anyway; partitions are how projectors scale out
(deploy/ keeps 8)."""


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach and use the Kafka-protocol log."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "hailstream"
    # Partitions of each topic at bootstrap. Batch events are keyed by batch id, so this bounds
    # the projector's parallelism.
    partitions: int = 8
    replication_factor: int = 1
    # Idempotent producers need InitProducerId v3+, which aiokafka does not send to tansu; on real
    # Kafka this should be on. Correctness never depends on it (consumers are idempotent).
    idempotent: bool = False
    linger_ms: int = 5
    # A producer's record batch, before compression (HS_KAFKA_MAX_BATCH_SIZE). A bunch's event
    # (1,024 specs, about 570 KB) is bigger than aiokafka's default 16 KiB or our old 256 KiB,
    # so each took a produce request of its own, and aiokafka sends one request at a time to a
    # broker: the client's six bunches in flight queued for it. 2 MiB takes three a request:
    # the 1M submit's server part -19.5% (bench.ab, three pairs, 95% interval -36%..-3%),
    # ingest's CPU -16%, the broker's -28% (docs/performance.md). On Kafka the *compressed*
    # batch must fit the broker's message.max.bytes (1 MiB by default; 24 KB here).
    max_batch_size: int = 2 * 1024 * 1024
    max_request_size: int = 8 * 1024 * 1024
    # zstd: a bunch of 1,024 no-op job specs is 401 bytes a job as msgpack and 8 compressed
    # (0.2 us a job to compress, 0.06 to decompress); the broker's CPU per job halved (issue 6).
    # Needs cramjam, aiokafka's codec library. HS_KAFKA_COMPRESSION=none turns it off.
    compression: str | None = "zstd"
    request_timeout_ms: int = 30_000
    # How long a fetch may wait for records. Kafka answers a waiting fetch as soon as records
    # arrive, so its default (500) costs no latency there; the local broker (tansu) answers only
    # when the wait is over, so the local stack sets a short one (HS_KAFKA_FETCH_MAX_WAIT_MS).
    fetch_max_wait_ms: int = 500
    # Short session timeouts keep consumer-group joins fast on the local broker.
    session_timeout_ms: int = 6_000
    heartbeat_interval_ms: int = 1_000
    topic_prefix: str = ""

    def topic(self, name: str) -> str:
        """The broker-side name of a logical topic (a prefix isolates test runs)."""
        return f"{self.topic_prefix}{name}"


class DatabaseSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach the projection database (MariaDB 10.11 or MySQL 8)."""

    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    name: str = "hailstream"
    pool_size: int = 10

    def url(self, *, database: bool = True) -> str:
        """A SQLAlchemy URL for PyMySQL; without the database name when ``database`` is false.

        Every engine is made from this URL, so this is where the process's engines are set to
        share one TLS context among their connections (:mod:`services.common.mysql`)."""
        from services.common import mysql  # sqlalchemy and pymysql: only where a DB is used

        mysql.install()
        auth = self.user if not self.password else f"{self.user}:{self.password}"
        db = f"/{self.name}" if database else "/"
        return f"mysql+pymysql://{auth}@{self.host}:{self.port}{db}?charset=utf8mb4"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a service needs to know about its environment."""

    log: LogSettings = msgspec.field(default_factory=LogSettings)
    db: DatabaseSettings = msgspec.field(default_factory=DatabaseSettings)
    data_dir: str = "var"
    # Shared storage roots (local directories for now): job specs, written by ingest and read by
    # workers, and container logs, written by workers and read by ingest. None: under data_dir
    # (see spec_root and log_root).
    spec_dir: str | None = None
    log_dir: str | None = None


def spec_root(settings: Settings) -> str:
    """The absolute root of the spec store: ``HS_SPEC_DIR``, default ``{data_dir}/specs``."""
    return os.path.abspath(settings.spec_dir or os.path.join(settings.data_dir, "specs"))


def log_root(settings: Settings) -> str:
    """The absolute root of the container logs: ``HS_LOG_DIR``, default ``{data_dir}/job-logs``.

    Not ``{data_dir}/logs``: the local stack keeps its processes' own logs there.
    """
    return os.path.abspath(settings.log_dir or os.path.join(settings.data_dir, "job-logs"))


def parse_bool(value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean, got {value!r}")


_CODECS = ("gzip", "snappy", "lz4", "zstd")


def _compression(value: str) -> str | None:
    """A producer compression codec, or ``none`` (or empty) for none."""
    if value.lower() in ("", "none"):
        return None
    if value.lower() not in _CODECS:
        raise ValueError(f"expected one of none, {', '.join(_CODECS)}; got {value!r}")
    return value.lower()


_LOG_ENV = {
    "HS_KAFKA_BOOTSTRAP": ("bootstrap_servers", str),
    "HS_KAFKA_CLIENT_ID": ("client_id", str),
    "HS_KAFKA_PARTITIONS": ("partitions", int),
    "HS_KAFKA_REPLICATION_FACTOR": ("replication_factor", int),
    "HS_KAFKA_IDEMPOTENT": ("idempotent", parse_bool),
    "HS_KAFKA_LINGER_MS": ("linger_ms", int),
    "HS_KAFKA_MAX_BATCH_SIZE": ("max_batch_size", int),
    "HS_KAFKA_COMPRESSION": ("compression", _compression),
    "HS_KAFKA_SESSION_TIMEOUT_MS": ("session_timeout_ms", int),
    "HS_KAFKA_FETCH_MAX_WAIT_MS": ("fetch_max_wait_ms", int),
    "HS_TOPIC_PREFIX": ("topic_prefix", str),
}
_DB_ENV = {
    "HS_DB_HOST": ("host", str),
    "HS_DB_PORT": ("port", int),
    "HS_DB_USER": ("user", str),
    "HS_DB_PASSWORD": ("password", str),
    "HS_DB_NAME": ("name", str),
    "HS_DB_POOL_SIZE": ("pool_size", int),
}


def log_env(settings: LogSettings) -> dict[str, str]:
    """The ``HS_*`` variables that make a child process read the log as ``settings`` say."""
    env: dict[str, str] = {}
    for var, (name, _) in _LOG_ENV.items():
        value = getattr(settings, name)
        if value is None:
            if name == "compression":  # off, where the default is on
                env[var] = "none"
            continue
        env[var] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return env


def pick_env(env: Mapping[str, str], table: Mapping[str, tuple[str, object]]
             ) -> dict[str, object]:
    """Parse the variables of ``table`` present in ``env`` into struct fields."""
    out: dict[str, object] = {}
    for var, (field, parse) in table.items():
        if var in env:
            try:
                out[field] = parse(env[var])  # type: ignore[operator]
            except ValueError as e:
                raise ValueError(f"{var}: {e}") from None
    return out


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read settings from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    log = LogSettings(**pick_env(env, _LOG_ENV))  # type: ignore[arg-type]
    if not 0 < log.max_batch_size <= log.max_request_size:
        raise ValueError(f"HS_KAFKA_MAX_BATCH_SIZE must be 1 to {log.max_request_size} bytes "
                         f"(a batch fits in a produce request), not {log.max_batch_size}")
    return Settings(
        log=log,
        db=DatabaseSettings(**pick_env(env, _DB_ENV)),  # type: ignore[arg-type]
        data_dir=env.get("HS_DATA_DIR", "var"),
        spec_dir=env.get("HS_SPEC_DIR") or None,
        log_dir=env.get("HS_LOG_DIR") or None,
    )

PROJECTOR_CONSUMER = "projector"
"""The projector's group id and the owner of its stored offsets (before the topic prefix)."""


def projector_consumer(log: LogSettings) -> str:
    """The projector's consumer name as stored in ``applied_offsets``."""
    return f"{log.topic_prefix}{PROJECTOR_CONSUMER}"


PROJECTOR_NICE_ENV = "HS_PROJECTOR_NICE"
"""How much the projector lowers its CPU priority at start (``os.nice``; 0-19, default 0)."""


def projector_nice(env: Mapping[str, str]) -> int:
    """The priority decrease :data:`PROJECTOR_NICE_ENV` asks for (default 0); ValueError,
    saying why, for a value that is not a whole number 0-19."""
    return _nice(env, PROJECTOR_NICE_ENV)


PROJECTOR_DB_NICE_ENV = "HS_PROJECTOR_DB_NICE"
"""How much the projector lowers the priority of the database server's threads that serve its
connections, when the server runs on this machine (0-19, default 0; see
:mod:`services.common.dbnice`)."""


def projector_db_nice(env: Mapping[str, str]) -> int:
    """The priority decrease :data:`PROJECTOR_DB_NICE_ENV` asks for (default 0); ValueError,
    saying why, for a value that is not a whole number 0-19."""
    return _nice(env, PROJECTOR_DB_NICE_ENV)


def _nice(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return 0
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number 0-19, not {raw!r}") from None
    if not 0 <= n <= 19:
        raise ValueError(f"{name} must be between 0 and 19, not {n}")
    return n


BUNCH_SLACK_ENV = "HS_INGEST_BUNCH_SLACK"
"""How many records the projector may be short of a job bunch when ingest answers it
(``services.ingest.commands.BUNCH_SLACK`` unless set)."""


def bunch_slack(raw: str) -> int:
    """A :data:`BUNCH_SLACK_ENV` value as a number of records; ValueError, saying why, for
    anything but a whole number 0 or more."""
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{BUNCH_SLACK_ENV} must be a whole number of records, "
                         f"not {raw!r}") from None
    if n < 0:
        raise ValueError(f"{BUNCH_SLACK_ENV} must be 0 or more, not {n}")
    return n
