"""`up` and `down`: start what is missing, stop what the stack started."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from services.common import procs
from services.common.log import LogError
from services.common.settings import TOPIC_BATCH
from services.stack import broker
from services.stack.components import (
    SEAWEED,
    Component,
    seaweed_component,
    service_components,
    stop_rank,
    tansu_component,
)
from services.stack.config import StackConfig
from services.stack.mariadb import ensure_mariadb, stop_mariadb
from services.stack.state import StackState, is_alive, load_state, record_process, save_state

Say = Callable[[str], None]


class StackError(RuntimeError):
    """A condition `up` cannot fix by itself (port taken, mode mismatch, crash at start)."""


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def _wait(ready: Callable[[], bool], *, pid: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if not procs.pid_alive(pid):
            raise StackError(f"{what} exited before it was ready")
        time.sleep(0.2)
    raise StackError(f"{what} was not ready within {timeout:.0f}s")


def _ready_check(comp: Component) -> Callable[[], bool]:
    if comp.name == SEAWEED:
        return lambda: procs.s3_bucket_ready(comp.port)
    if comp.port:
        return lambda: procs.port_open(comp.port)
    return lambda: True


def ensure_process(cfg: StackConfig, state: StackState, comp: Component, say: Say) -> None:
    """Start ``comp`` unless our recorded process for it runs; wait until it is ready."""
    rec = state.get(comp.name)
    if rec is not None and is_alive(rec):
        _wait(_ready_check(comp), pid=rec.pid, timeout=cfg.stack.start_timeout_s, what=comp.name)
        say(f"{comp.name}: already running (pid {rec.pid})")
        return
    if rec is not None:
        say(f"{comp.name}: recorded pid {rec.pid} is gone; starting it again")
        state.remove(comp.name)
        save_state(cfg.state_path, state)
    taken = [p for p in comp.ports if procs.port_open(p)]
    if taken:
        raise StackError(f"{comp.name}: port(s) {taken} already in use by a process this stack "
                         f"did not start (another stack? set other ports)")
    log = cfg.log_path(comp.name)
    proc = procs.spawn(comp.argv, log_path=log, env=comp.env)
    # Record it before waiting, so `down` can clean up even if the wait fails.
    state.put(record_process(comp.name, proc.pid, comp.port, log, comp.argv))
    save_state(cfg.state_path, state)
    try:
        _wait(_ready_check(comp), pid=proc.pid, timeout=cfg.stack.start_timeout_s,
              what=comp.name)
    except StackError as e:
        procs.terminate(proc.pid)
        state.remove(comp.name)
        save_state(cfg.state_path, state)
        raise StackError(f"{e}; last lines of {log}:\n{_log_tail(log)}") from None
    say(f"{comp.name}: started (pid {proc.pid}, port {comp.port}, log {log})")


def db_up(cfg: StackConfig, say: Say) -> None:
    """Make MariaDB answer; remember in the state whether the stack started it."""
    db = cfg.settings.db
    started = ensure_mariadb(db, timeout=cfg.stack.start_timeout_s,
                             install=cfg.stack.install_db, say=say)
    if started:
        state = load_state(cfg.state_path)
        state.db_started = True
        save_state(cfg.state_path, state)
        say(f"mariadb: started on {db.host}:{db.port}")
    else:
        say(f"mariadb: reachable on {db.host}:{db.port}")


def _drop_stale_projections(cfg: StackConfig) -> bool:
    """Drop the database if it holds projections of a log that no longer exists.

    Projections are derived from the log. When the log is new (its topics were just created:
    a wiped data directory, or a memory broker restarted), offsets stored in the database point
    past its end and new events would be skipped as applied. Returns whether it dropped.
    """
    import sqlalchemy as sa

    db = cfg.settings.db
    engine = sa.create_engine(db.url(database=False))
    try:
        with engine.begin() as conn:
            exists = conn.execute(sa.text(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :d "
                "AND TABLE_NAME = 'applied_offsets'"), {"d": db.name}).scalar_one()
            if not exists:
                return False
            rows = conn.execute(sa.text(f"SELECT COUNT(*) FROM `{db.name}`.applied_offsets")
                                ).scalar_one()
            if not rows:
                return False
            conn.execute(sa.text(f"DROP DATABASE `{db.name}`"))
            return True
    finally:
        engine.dispose()


def setup(cfg: StackConfig, say: Say) -> None:
    """Create missing topics and apply migrations on the configured broker and database.

    Starts nothing: against real Kafka and MySQL 8 (docker-compose, deploy/) this is the whole
    set-up; `up` calls it once the local broker runs.
    """
    log = cfg.settings.log
    asyncio.run(broker.wait_for_broker(log, wait_s=cfg.stack.start_timeout_s))
    try:
        created = asyncio.run(broker.bootstrap(log))
    except LogError as e:
        raise StackError(f"topic bootstrap failed: {e}") from None
    missing = asyncio.run(broker.missing_topics(log))
    if missing:
        raise StackError(f"topics {missing} are missing after bootstrap "
                         f"(see {cfg.log_path('tansu')})")
    say(f"topics: created {', '.join(created)}" if created else "topics: all present")

    from sql.migrate import MigrationError, apply_migrations

    if log.topic(TOPIC_BATCH) in created and _drop_stale_projections(cfg):
        say("database: dropped projections of an earlier log (they are rebuilt from the log)")
    try:
        applied = apply_migrations(cfg.settings.db)
    except MigrationError as e:
        raise StackError(f"migrations failed: {e}") from None
    say(f"migrations: applied {applied}" if applied else "migrations: up to date")


def up(cfg: StackConfig, say: Say) -> StackState:
    """Bring the whole stack up; components that already run are left alone."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    state = load_state(cfg.state_path)
    running = [p.name for p in state.processes if is_alive(p)]
    if running and state.mode not in (None, cfg.stack.mode):
        raise StackError(f"the stack runs in {state.mode} mode ({', '.join(running)}); "
                         f"run `down` before switching to {cfg.stack.mode}")
    db_up(cfg, say)
    state = load_state(cfg.state_path)
    state.mode = cfg.stack.mode
    save_state(cfg.state_path, state)

    if cfg.stack.mode == "durable":
        cfg.seaweed_dir.mkdir(parents=True, exist_ok=True)
        ensure_process(cfg, state, seaweed_component(cfg), say)
    ensure_process(cfg, state, tansu_component(cfg), say)
    setup(cfg, say)

    ingest_url = None
    for comp in service_components(cfg):
        ensure_process(cfg, state, comp, say)
        if comp.name == "ingest":
            ingest_url = f"http://127.0.0.1:{comp.port}"
    if ingest_url is not None:
        from services.stack.bootstrap import ensure_dev_user

        ensure_dev_user(cfg, ingest_url, say)
    return state


def down(cfg: StackConfig, say: Say, *, with_db: bool = False) -> None:
    """Stop what `up` started, services first; MariaDB only with ``with_db``. Idempotent."""
    state = load_state(cfg.state_path)
    if not state.processes:
        say("nothing to stop")
    for rec in sorted(state.processes, key=lambda p: stop_rank(p.name)):
        if is_alive(rec):
            procs.terminate(rec.pid, timeout=15)
            say(f"{rec.name}: stopped (pid {rec.pid})")
        else:
            say(f"{rec.name}: was not running")
        state.remove(rec.name)
        save_state(cfg.state_path, state)
    from services.scheduler.drivers.local import reap_instances

    for name in reap_instances(cfg.data_dir):
        say(f"instance {name}: worker stopped")
    if state.db_started:
        if with_db:
            stop_mariadb(say)
            state.db_started = False
            say("mariadb: stopped")
        else:
            say("mariadb: left running (started by `up`; stop it with `down --with-db`)")
    state.mode = None
    save_state(cfg.state_path, state)
