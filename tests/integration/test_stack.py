"""The local stack CLI, run as a user would: `up`, `status --json`, `down`, durability.

Every stack here has its own data directory, free ports (never the defaults) and its own
database, so it clashes neither with a developer's running stack nor with other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from schemas.batch import BatchCreated
from services.common import procs
from services.common.log import ConsumerOptions, LogConsumer, Publisher, Record
from services.common.offsets import MySQLOffsetStore
from services.common.settings import (
    LOCAL_BROKER_FETCH_MAX_WAIT_MS,
    LOCAL_BROKER_PARTITIONS,
    TOPIC_BATCH,
    DatabaseSettings,
    LogSettings,
)
from services.stack.config import (
    LOCAL_BUNCH_SLACK,
    LOCAL_PROJECTOR_NICE,
    LOCAL_WORKER_CORES,
    SEAWEED_PORT_SPAN,
    SERVICE_PORT_SPAN,
    load_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    env: dict[str, str]
    data_dir: Path
    kafka_port: int
    s3_port: int
    db_name: str

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "services.stack", *args], env=self.env,
                              cwd=REPO, capture_output=True, text=True, timeout=240)
        if check and proc.returncode != 0:
            raise AssertionError(f"stack {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def status(self) -> tuple[int, dict[str, Any]]:
        proc = self.run("status", "--json", check=False)
        return proc.returncode, json.loads(proc.stdout)

    def recorded_pids(self) -> dict[str, int]:
        try:
            state = json.loads((self.data_dir / "stack.json").read_text())
        except FileNotFoundError:
            return {}
        return {p["name"]: p["pid"] for p in state["processes"]}


def _drop_database(name: str) -> None:
    conn = pymysql.connect(host=os.environ.get("HS_DB_HOST", "127.0.0.1"),
                           port=int(os.environ.get("HS_DB_PORT", "3306")),
                           user=os.environ.get("HS_DB_USER", "root"),
                           password=os.environ.get("HS_DB_PASSWORD", ""))
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("stack")
    seaweed_base = procs.free_port_block(SEAWEED_PORT_SPAN)
    kafka_port = procs.free_port()
    db_name = f"hs_test_{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HS_STACK_", "HS_KAFKA"))}
    env.update({
        "HS_DATA_DIR": str(data_dir),
        "HS_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        "HS_STACK_SEAWEED_BASE_PORT": str(seaweed_base),
        "HS_STACK_SERVICE_BASE_PORT": str(procs.free_port_block(SERVICE_PORT_SPAN)),
        "HS_STACK_MODE": "durable",
        "HS_STACK_INSTALL_DB": "false",
        "HS_DB_NAME": db_name,
    })
    st = Stack(env=env, data_dir=data_dir, kafka_port=kafka_port, s3_port=seaweed_base + 3,
               db_name=db_name)
    try:
        yield st
    finally:
        try:
            st.run("down", check=False)
        finally:
            # Whatever `down` missed (it should miss nothing) must not outlive the tests.
            for pid in st.recorded_pids().values():
                procs.terminate(pid, timeout=5)
            _drop_database(db_name)


def _wait_closed(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.port_open(port):
            return True
        time.sleep(0.1)
    return False


def test_up_runs_durable_stack_and_status_reports_it(stack: Stack) -> None:
    out = stack.run("up").stdout
    assert f"HS_KAFKA_BOOTSTRAP={stack.bootstrap}" in out
    code, status = stack.status()
    assert code == 0, status["errors"]
    assert status["ok"] and status["mode"] == "durable" and status["broker_ok"]
    components = {c["name"]: c for c in status["components"]}
    assert components["tansu"]["alive"] and components["tansu"]["listening"]
    assert components["tansu"]["port"] == stack.kafka_port
    assert components["seaweed"]["alive"] and components["seaweed"]["listening"]
    assert components["seaweed"]["port"] == stack.s3_port
    assert set(status["topics"]) >= {"batch-events", "control-events", "scheduler-events",
                                     "completions"}
    assert status["database"]["reachable"] and status["database"]["name"] == stack.db_name
    assert status["env"]["HS_KAFKA_BOOTSTRAP"] == stack.bootstrap
    # The projector runs at a lower priority than the request path (LOCAL_PROJECTOR_NICE).
    pids = stack.recorded_pids()
    assert _nice(pids["projector"]) == min(19, os.getpriority(os.PRIO_PROCESS, 0)
                                           + LOCAL_PROJECTOR_NICE)
    assert _nice(pids["ingest"]) == os.getpriority(os.PRIO_PROCESS, 0)
    # So do MariaDB's threads that serve the projector's connections (services.common.dbnice).
    lowered = _server_thread_nices(pids["projector"], stack)
    assert lowered and all(n >= LOCAL_PROJECTOR_NICE for n in lowered), lowered


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[16])


def _server_thread_nices(pid: int, stack: Stack) -> list[int]:
    """The priorities of the database server's threads that serve ``pid``'s connections
    (found by the client ports of its sockets to the server), waiting until it has one."""
    db = DatabaseSettings(name=stack.db_name)
    engine = sa.create_engine(db.url(database=False), poolclass=sa.pool.NullPool)
    try:
        deadline = time.monotonic() + 30
        while True:
            ports = _client_ports(pid, db.port)
            with engine.connect() as conn:
                tids = [int(tid) for host, tid in conn.execute(sa.text(
                    "SELECT HOST, TID FROM information_schema.PROCESSLIST")).all()
                        if host and host.rpartition(":")[2].isdigit()
                        and int(host.rpartition(":")[2]) in ports]
            if tids or time.monotonic() > deadline:
                return [os.getpriority(os.PRIO_PROCESS, tid) for tid in tids]
            time.sleep(0.5)
    finally:
        engine.dispose()


def _client_ports(pid: int, server_port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to ``server_port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rpartition(":")[2], 16) == server_port:
                ports.add(int(local.rpartition(":")[2], 16))
    return ports


def test_up_twice_starts_no_duplicates(stack: Stack) -> None:
    stack.run("up", "--quiet")
    before = stack.recorded_pids()
    out = stack.run("up", "--quiet").stdout
    assert "already running" in out
    assert stack.recorded_pids() == before
    marks = (str(stack.data_dir), f"tcp://127.0.0.1:{stack.kafka_port}")
    # Infrastructure carries the data dir or port on its command line; services carry the
    # stack's data dir in their environment.
    ours = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if procs.pid_alive(pid) and (any(m in _cmdline(pid) for m in marks)
                                         or f"HS_DATA_DIR={stack.data_dir}" in _environ(pid))]
    assert sorted(ours) == sorted(before.values())
    assert stack.status()[0] == 0


def _environ(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


N_EVENTS = 200
PARTITIONS = 4


async def _publish(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=f"k{i % 10}".encode(), value=str(i).encode())
                   for i in range(N_EVENTS)]
        for fut in futures:
            await fut
    finally:
        await producer.stop()


async def _consume_all(bootstrap: str, topic: str) -> dict[int, list[tuple[int, int]]]:
    """(offset, value) per partition, read from the beginning until N_EVENTS came back."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < N_EVENTS and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                got[tp.partition] += [(r.offset, int(r.value or b"-1")) for r in records]
    finally:
        await consumer.stop()
    return got


async def test_durable_stack_keeps_events_across_restart(stack: Stack) -> None:
    stack.run("up", "--quiet")
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    await _publish(stack.bootstrap, topic)
    stack.run("down")
    assert _wait_closed(stack.kafka_port)
    stack.run("up", "--quiet")
    got = await _consume_all(stack.bootstrap, topic)
    values = sorted(v for records in got.values() for _, v in records)
    assert values == list(range(N_EVENTS))
    for records in got.values():
        offsets = [o for o, _ in records]
        assert offsets == list(range(len(records)))  # nothing lost or duplicated
        assert [v for _, v in records] == sorted(v for _, v in records)  # order kept


async def test_status_reports_consumer_lag_from_the_database(stack: Stack) -> None:
    """Events published through the adapter, partly applied by a consumer that stores its
    offsets in the stack's database: status reports exactly the unapplied remainder."""
    stack.run("up", "--quiet")
    log = LogSettings(bootstrap_servers=stack.bootstrap)
    db = DatabaseSettings(name=stack.db_name)
    async with Publisher(log) as pub:
        await pub.publish_many([
            BatchCreated(batch_id=i, user="u", billing_project="p", token=f"t{i}")
            for i in range(100)])
    engine = sa.create_engine(db.url())
    try:
        store = MySQLOffsetStore(engine)
        options = ConsumerOptions(name="lag-probe", topics=[TOPIC_BATCH], group=False,
                                  max_records=30)
        async with LogConsumer(log, options, store) as consumer:
            batch: list[Record] = []
            while not batch:
                batch = await consumer.next_batch()
            applied, _ = store.apply(options.name, batch, lambda conn, fresh: None)
    finally:
        engine.dispose()
    assert 0 < applied <= 30
    code, status = stack.status()
    assert code == 0
    rows = [r for r in status["lag"] if r["consumer"] == "lag-probe"]
    assert {r["topic"] for r in rows} == {TOPIC_BATCH}
    assert sum(r["lag"] for r in rows) == 100 - applied
    assert sum(r["next_offset"] for r in rows) == applied


def test_down_stops_everything_and_is_idempotent(stack: Stack) -> None:
    stack.run("up", "--quiet")
    pids = stack.recorded_pids()
    assert set(pids) == {"seaweed", "tansu", "projector", "ingest", "scheduler", "completions"}
    out = stack.run("down").stdout
    assert "tansu: stopped" in out and "seaweed: stopped" in out
    assert out.index("projector: stopped") < out.index("tansu: stopped")
    assert out.index("ingest: stopped") < out.index("tansu: stopped")
    assert out.index("tansu: stopped") < out.index("seaweed: stopped")
    assert not any(procs.pid_alive(pid) for pid in pids.values())
    assert _wait_closed(stack.kafka_port) and _wait_closed(stack.s3_port)
    assert stack.recorded_pids() == {}
    code, status = stack.status()
    assert code == 1 and not status["ok"]
    assert not any(c["alive"] for c in status["components"])
    again = stack.run("down")
    assert again.returncode == 0 and "nothing to stop" in again.stdout


def test_the_local_stack_uses_few_partitions_unless_told_otherwise(tmp_path: Path) -> None:
    base = {"HS_DATA_DIR": str(tmp_path)}
    config = load_config(base)
    assert config.settings.log.partitions == LOCAL_BROKER_PARTITIONS
    assert config.client_env()["HS_KAFKA_PARTITIONS"] == str(LOCAL_BROKER_PARTITIONS)
    asked = load_config({**base, "HS_KAFKA_PARTITIONS": "8"})
    assert asked.settings.log.partitions == 8
    assert asked.client_env()["HS_KAFKA_PARTITIONS"] == "8"


def test_local_workers_announce_more_cores_and_the_broker_waits_longer_unless_told(
        tmp_path: Path) -> None:
    base = {"HS_DATA_DIR": str(tmp_path)}
    env = load_config(base).client_env()
    assert env["HS_SCHEDULER_WORKER_CORES"] == str(LOCAL_WORKER_CORES)
    assert env["HS_KAFKA_FETCH_MAX_WAIT_MS"] == str(LOCAL_BROKER_FETCH_MAX_WAIT_MS)
    asked = load_config({**base, "HS_SCHEDULER_WORKER_CORES": "4",
                         "HS_KAFKA_FETCH_MAX_WAIT_MS": "10"}).client_env()
    assert (asked["HS_SCHEDULER_WORKER_CORES"], asked["HS_KAFKA_FETCH_MAX_WAIT_MS"]) == (
        "4", "10")
    with pytest.raises(ValueError, match="HS_SCHEDULER_WORKER_CORES"):
        load_config({**base, "HS_SCHEDULER_WORKER_CORES": "many"})


def test_the_local_projector_yields_the_cores_unless_told(tmp_path: Path) -> None:
    base = {"HS_DATA_DIR": str(tmp_path)}
    env = load_config(base).client_env()
    assert env["HS_PROJECTOR_NICE"] == str(LOCAL_PROJECTOR_NICE)
    # Its database threads as much, and bunches are answered further ahead of it.
    assert env["HS_PROJECTOR_DB_NICE"] == str(LOCAL_PROJECTOR_NICE)
    assert env["HS_INGEST_BUNCH_SLACK"] == str(LOCAL_BUNCH_SLACK)
    assert load_config({**base, "HS_PROJECTOR_NICE": "5"}).client_env()[
        "HS_PROJECTOR_DB_NICE"] == "5"
    told = load_config({**base, "HS_PROJECTOR_DB_NICE": "0",
                        "HS_INGEST_BUNCH_SLACK": "512"}).client_env()
    assert (told["HS_PROJECTOR_NICE"], told["HS_PROJECTOR_DB_NICE"],
            told["HS_INGEST_BUNCH_SLACK"]) == (str(LOCAL_PROJECTOR_NICE), "0", "512")
    for name, bad in (("HS_PROJECTOR_DB_NICE", "20"), ("HS_INGEST_BUNCH_SLACK", "many")):
        with pytest.raises(ValueError, match=name):
            load_config({**base, name: bad})
    assert load_config({**base, "HS_PROJECTOR_NICE": "0"}).client_env()[
        "HS_PROJECTOR_NICE"] == "0"
    for bad in ("low", "20", "-1"):
        with pytest.raises(ValueError, match="HS_PROJECTOR_NICE"):
            load_config({**base, "HS_PROJECTOR_NICE": bad})


def test_the_projector_refuses_a_priority_it_cannot_take() -> None:
    out = subprocess.run([sys.executable, "-m", "services.projector"],
                         env={**os.environ, "HS_PROJECTOR_NICE": "lowest"}, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "HS_PROJECTOR_NICE must be a whole number 0-19, not 'lowest'" in out.stderr
