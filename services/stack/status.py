"""`status`: what runs, the topics, and consumer lag, as a table or as JSON."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pymysql
from aiokafka.errors import KafkaError
from rich.console import Console
from rich.table import Table

from services.common import procs
from services.common.log import LogError
from services.stack import broker
from services.stack.components import (
    TANSU,
    seaweed_component,
    service_components,
    tansu_component,
)
from services.stack.config import StackConfig
from services.stack.mariadb import db_reachable
from services.stack.state import is_alive, load_state


class ComponentStatus(msgspec.Struct, kw_only=True):
    name: str
    pid: int | None
    alive: bool
    port: int | None
    listening: bool
    log: str


class DatabaseStatus(msgspec.Struct, kw_only=True):
    host: str
    port: int
    name: str
    reachable: bool
    started_by_stack: bool


class Lag(msgspec.Struct, kw_only=True):
    consumer: str
    topic: str
    partition: int
    next_offset: int
    high_watermark: int | None
    lag: int | None


class StackStatus(msgspec.Struct, kw_only=True):
    ok: bool
    mode: str
    data_dir: str
    components: list[ComponentStatus]
    database: DatabaseStatus
    broker_ok: bool
    topics: dict[str, int]
    lag: list[Lag]
    errors: list[str]
    env: dict[str, str]


def _components(cfg: StackConfig, mode: str) -> list[ComponentStatus]:
    state = load_state(cfg.state_path)
    expected = [tansu_component(cfg), *service_components(cfg)]
    if mode == "durable":
        expected.insert(0, seaweed_component(cfg))
    out = []
    for comp in expected:
        rec = state.get(comp.name)
        alive = rec is not None and is_alive(rec)
        port = rec.port if rec is not None else (comp.port or None)
        out.append(ComponentStatus(
            name=comp.name, pid=rec.pid if rec is not None else None, alive=alive, port=port,
            # A component without a port (the projector) is serving when it is alive.
            listening=alive if not port else procs.port_open(port),
            log=rec.log if rec is not None else str(cfg.log_path(comp.name))))
    return out


def _applied_offsets(cfg: StackConfig) -> list[tuple[str, str, int, int]]:
    db = cfg.settings.db
    try:
        conn = pymysql.connect(host=db.host, port=db.port, user=db.user, password=db.password,
                               database=db.name, connect_timeout=2)
    except pymysql.err.OperationalError:
        return []  # the database does not exist (yet)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT consumer, topic, kafka_partition, next_offset "
                        "FROM applied_offsets ORDER BY consumer, topic, kafka_partition")
            return [(str(c), str(t), int(p), int(n)) for c, t, p, n in cur.fetchall()]
    except pymysql.err.ProgrammingError:
        return []  # not migrated yet
    finally:
        conn.close()


async def _broker_facts(cfg: StackConfig, lag_topics: list[str]
                        ) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    log = cfg.settings.log
    topics = await broker.describe_topics(log)
    # applied_offsets holds logical topic names, as high_watermarks expects.
    marks = await broker.high_watermarks(log, sorted(set(lag_topics)))
    return topics, marks


def _lag(offsets: list[tuple[str, str, int, int]],
         marks: dict[tuple[str, int], int]) -> list[Lag]:
    """Lag of every consumer on every partition of the topics it reads.

    A partition the consumer has no row for yet has applied nothing: its whole length is lag.
    """
    stored = {(c, t, p): n for c, t, p, n in offsets}
    reads = {(c, t) for c, t, _, _ in offsets}
    keys = set(stored) | {(c, t, p) for c, t in reads for (mt, p) in marks if mt == t}
    out = []
    for consumer, topic, partition in sorted(keys):
        next_offset = stored.get((consumer, topic, partition), 0)
        hw = marks.get((topic, partition))
        out.append(Lag(consumer=consumer, topic=topic, partition=partition,
                       next_offset=next_offset, high_watermark=hw,
                       lag=None if hw is None else max(0, hw - next_offset)))
    return out


def collect(cfg: StackConfig) -> StackStatus:
    """Probe every component; never raises for a component that is down."""
    state = load_state(cfg.state_path)
    mode = state.mode or cfg.stack.mode
    components = _components(cfg, mode)
    db = cfg.settings.db
    database = DatabaseStatus(host=db.host, port=db.port, name=db.name,
                              reachable=db_reachable(db), started_by_stack=state.db_started)
    errors: list[str] = []
    offsets = _applied_offsets(cfg) if database.reachable else []
    if not database.reachable:
        errors.append(f"MariaDB is not reachable at {db.host}:{db.port}")
    topics: dict[str, int] = {}
    marks: dict[tuple[str, int], int] = {}
    broker_ok = False
    tansu = next(c for c in components if c.name == TANSU)
    if tansu.listening:
        try:
            topics, marks = asyncio.run(_broker_facts(cfg, [o[1] for o in offsets]))
            broker_ok = True
        except (KafkaError, LogError, OSError, TimeoutError) as e:
            errors.append(f"broker query failed: {e!r}")
    else:
        errors.append(f"the broker is not listening on {cfg.bootstrap}")
    lag = _lag(offsets, marks)
    for c in components:
        if not (c.alive and c.listening):
            errors.append(f"{c.name} is not running" if not c.alive
                          else f"{c.name} is not listening on {c.port}")
    ok = database.reachable and broker_ok and all(c.alive and c.listening for c in components)
    return StackStatus(ok=ok, mode=mode, data_dir=str(cfg.data_dir), components=components,
                       database=database, broker_ok=broker_ok, topics=topics, lag=lag,
                       errors=errors, env=cfg.client_env())


def to_json(status: StackStatus) -> str:
    return msgspec.json.format(msgspec.json.encode(status)).decode()


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


def render(status: StackStatus, console: Console) -> None:
    table = Table(title=f"hailstream stack ({status.mode}, {status.data_dir})")
    for col in ("component", "pid", "alive", "port", "listening", "log"):
        table.add_column(col)
    db = status.database
    table.add_row("mariadb" + (" (started by stack)" if db.started_by_stack else ""), "-",
                  _yes(db.reachable), str(db.port), _yes(db.reachable), "-")
    for c in status.components:
        table.add_row(c.name, str(c.pid or "-"), _yes(c.alive), str(c.port or "-"),
                      _yes(c.listening), c.log)
    console.print(table)
    if status.topics:
        topics = Table(title="topics")
        topics.add_column("topic")
        topics.add_column("partitions", justify="right")
        for name, n in sorted(status.topics.items()):
            topics.add_row(name, str(n))
        console.print(topics)
    if status.lag:
        lag = Table(title="consumer lag")
        for col in ("consumer", "topic", "partition", "next offset", "high watermark", "lag"):
            lag.add_column(col, justify="right" if col != "consumer" else "left")
        for row in status.lag:
            lag.add_row(row.consumer, row.topic, str(row.partition), str(row.next_offset),
                        _or_dash(row.high_watermark), _or_dash(row.lag))
        console.print(lag)
    for err in status.errors:
        console.print(f"[red]![/red] {err}")


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)

