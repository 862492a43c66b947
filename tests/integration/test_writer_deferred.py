"""The writer's deferred updates and regrouped inserts give the same rows as running every
operation in order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymysql.converters import escape_string

from core.projection.ops import Delete, InsertIgnore, Op, Update, UpdateIn, Upsert
from services.common.settings import DatabaseSettings
from services.projector import writer as writer_module
from services.projector.writer import (
    COLUMN_DEFAULTS,
    DEFERRED_KEYS,
    Literals,
    Writer,
    escape_text,
)
from tests.integration.sql_modes import escapes_mode

pytestmark = pytest.mark.integration

B = 990_001  # a batch id no other test of the module uses


@pytest.fixture(scope="module")
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url())
    yield engine
    engine.dispose()


jobs = st.integers(1, 3)
attempts = st.sampled_from(["a", "b"])
times = st.one_of(st.none(), st.integers(0, 10**6))
TRICKY = ["%s", "%(x)s 100%", "it's \"q\"", "back\\slash\\", "tab\tnl\nr\r", "ünï 😀",
          "nul\x00z", "\x1a;--", ""]
"""Strings the writer's literals must escape as the driver's parameters do."""
ops = st.one_of(
    st.builds(lambda j, a, i: InsertIgnore("attempts", [{
        "batch_id": B, "job_id": j, "attempt_id": a, "instance_name": i}]),
        jobs, attempts, st.sampled_from(["w1", "w2", *TRICKY])),
    st.builds(lambda j, a, t: Upsert("attempts", [{
        "batch_id": B, "job_id": j, "attempt_id": a, "start_time_ms": t}], ("start_time_ms",)),
        jobs, attempts, times),
    st.builds(lambda j, a, t: Update("attempts", {"start_time_ms": t}, {
        "batch_id": B, "job_id": j, "attempt_id": a}), jobs, attempts, times),
    st.builds(lambda j, a, t, r: Update("attempts", {"end_time_ms": t, "reason": r}, {
        "batch_id": B, "job_id": j, "attempt_id": a}), jobs, attempts, times,
        st.sampled_from([None, "lost", *TRICKY])),
    st.builds(lambda j, a, t: Update("attempts", {"rollup_time_ms": t, "end_time_ms": t}, {
        "batch_id": B, "job_id": j, "attempt_id": a}), jobs, attempts, times),
    st.builds(lambda j, t: Update("attempts", {"rollup_time_ms": t}, {
        "batch_id": B, "job_id": j}), jobs, times),                    # not by primary key
    st.builds(lambda a, ids, t: UpdateIn("attempts", {"reason": t}, {
        "batch_id": B, "attempt_id": a}, "job_id", ids), attempts,
        st.lists(jobs, min_size=1, max_size=3), st.sampled_from(["x", "y"])),
    st.builds(lambda a, ids, t: UpdateIn("attempts", {"reason": t}, {  # too big to defer
        "batch_id": B, "attempt_id": a}, "job_id", ids), attempts,
        st.lists(jobs, min_size=17, max_size=20), st.sampled_from(["x", "z"])),
    st.builds(lambda j: Delete("attempts", {"batch_id": B, "job_id": j}), jobs),
    st.builds(lambda j, a, r: Update("attempts", {"resources": r}, {
        "batch_id": B, "job_id": j, "attempt_id": a}), jobs, attempts,
        st.sampled_from([None, '{"r/1":3}', '{"r/1":3,"s/1":4}'])),
    # a table whose updates are not deferred, beside the attempts
    st.builds(lambda j, a, q: InsertIgnore("job_attributes", [{
        "batch_id": B, "job_id": j, "attr_key": a, "attr_value": str(q)}]),
        jobs, attempts, st.integers(1, 9)),
    st.builds(lambda j, a, q: Upsert("job_attributes", [{
        "batch_id": B, "job_id": j, "attr_key": a, "attr_value": str(q)}],
        ("attr_value",)), jobs, attempts, st.integers(1, 9)),
    st.builds(lambda j: Delete("job_attributes", {"batch_id": B, "job_id": j}), jobs),
)


def _rows(conn: sa.Connection) -> list[tuple[object, ...]]:
    return [tuple(r) for r in conn.execute(sa.text(
        "SELECT job_id, attempt_id, instance_name, start_time_ms, end_time_ms, rollup_time_ms, "
        "reason, resources FROM attempts WHERE batch_id = :b ORDER BY job_id, attempt_id"),
        {"b": B})] + [tuple(r) for r in conn.execute(sa.text(
            "SELECT job_id, attr_key, attr_value FROM job_attributes "
            "WHERE batch_id = :b ORDER BY job_id, attr_key"), {"b": B})]


def _apply(engine: sa.Engine, sequence: list[Op], *, flush_each: bool,
           reads: frozenset[int], direct: bool = False) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            writer = Writer(conn)
            for i, op in enumerate(sequence):
                if flush_each:  # the reference: each operation as its own statement, in order
                    if isinstance(op, InsertIgnore | Upsert):
                        writer._write_run([op])
                    else:
                        writer._write(op)
                    continue
                keys = DEFERRED_KEYS.get(op.table, ())
                if direct and isinstance(op, Update) and set(op.where) == set(keys):
                    # the handlers' way: a row by its primary key, without the op
                    writer.update_row(op.table, tuple(op.where[k] for k in keys), op.values)
                else:
                    writer.emit([op])
                if i in reads:
                    writer.flush()  # a handler's read flushes mid-way
            writer.flush()
            return _rows(conn)
        finally:
            trans.rollback()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.lists(ops, max_size=25), st.frozensets(st.integers(0, 25), max_size=3),
       st.booleans())
def test_deferred_updates_equal_updates_in_order(engine: sa.Engine, sequence: list[Op],
                                                 reads: frozenset[int], direct: bool) -> None:
    """Also with the rows updated by primary key through ``update_row`` (``direct``)."""
    assert _apply(engine, sequence, flush_each=False, reads=reads, direct=direct) == _apply(
        engine, sequence, flush_each=True, reads=frozenset())


def test_many_rows_with_the_same_columns_are_one_statement(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            writer = Writer(conn)
            writer.emit([InsertIgnore("attempts", [
                {"batch_id": B, "job_id": j, "attempt_id": "a", "instance_name": "w"}
                for j in range(1, 1_201)])])
            writer.flush()
            before = writer.statements
            writer.emit([Update("attempts", {"start_time_ms": j, "reason": None},
                                {"batch_id": B, "job_id": j, "attempt_id": "a"})
                         for j in range(1, 1_201)])
            writer.emit([Update("attempts", {"start_time_ms": 7},  # merged into job 5's row
                                {"batch_id": B, "job_id": 5, "attempt_id": "a"})])
            writer.flush()
            assert writer.statements - before == 3  # 1,200 rows in chunks of 500
            got = dict(conn.execute(sa.text(
                "SELECT job_id, start_time_ms FROM attempts WHERE batch_id = :b"), {"b": B}).all())
            assert got == {j: (7 if j == 5 else j) for j in range(1, 1_201)}
        finally:
            trans.rollback()


def test_rows_inserted_and_updated_in_one_flush_are_written_once(engine: sa.Engine) -> None:
    """An SJ's attempt row and its MJC's update, in one transaction: one upsert of the
    merged rows beside one insert of the rows nobody updated, not an insert and an update."""
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(sa.text("INSERT INTO attempts (batch_id, job_id, attempt_id, "
                                 "instance_name, end_time_ms) VALUES (:b, 1, 'a', 'old', 5)"),
                         {"b": B})
            writer = Writer(conn)
            writer.emit([InsertIgnore("attempts", [
                {"batch_id": B, "job_id": j, "attempt_id": "a", "instance_name": "w"}
                for j in range(1, 11)])])
            for j in range(1, 11, 2):  # job 1's row exists: its update still applies
                writer.update_row("attempts", (B, j, "a"), {"start_time_ms": j})
                writer.update_row("attempts", (B, j, "a"), {"end_time_ms": 100 + j})
            writer.flush()
            assert writer.statements == 2
            got = conn.execute(sa.text(
                "SELECT job_id, instance_name, start_time_ms, end_time_ms FROM attempts "
                "WHERE batch_id = :b ORDER BY job_id"), {"b": B}).all()
            assert [tuple(r) for r in got] == [
                (j, "old" if j == 1 else "w", j if j % 2 else None,
                 100 + j if j % 2 else None) for j in range(1, 11)]
        finally:
            trans.rollback()


@pytest.mark.parametrize("no_backslash_escapes", [False, True], ids=["default", "nbe"])
@pytest.mark.parametrize("value", [*TRICKY, "x" * 100, None])
def test_literals_round_trip(engine: sa.Engine, value: str | None,
                             no_backslash_escapes: bool) -> None:
    """What the writer inlines as literals reads back as the value itself, in inserts and in
    merged updates alike, whether or not the session treats backslashes as escapes."""
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        trans = conn.begin()
        try:
            writer = Writer(conn)
            writer.emit([InsertIgnore("attempts", [
                {"batch_id": B, "job_id": j, "attempt_id": "a", "instance_name": value}
                for j in (1, 2)])])
            writer.emit([Update("attempts", {"reason": value and value[:40], "start_time_ms": j},
                                {"batch_id": B, "job_id": j, "attempt_id": "a"}) for j in (1, 2)])
            writer.flush()
            got = conn.execute(sa.text(
                "SELECT instance_name, reason, start_time_ms FROM attempts WHERE batch_id = :b "
                "ORDER BY job_id"), {"b": B}).all()
            short = value and value[:40]
            assert [tuple(r) for r in got] == [(value, short, 1), (value, short, 2)]
        finally:
            trans.rollback()


@pytest.mark.parametrize("limit", [1_000_000, 1_000], ids=["one-statement", "split"])
def test_rows_past_the_statement_limit_split_into_several(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """A multi-row insert within the limit is one statement; past it, as many statements as
    keep each within it, every row inserted once."""
    monkeypatch.setattr(writer_module, "MAX_STATEMENT", limit)
    rows = [{"batch_id": B, "job_id": j, "attempt_id": f"attempt-{j:04d}",
             "instance_name": f"instance-{j:04d}"} for j in range(1, 101)]
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            writer = Writer(conn)
            sent: list[str] = []
            send = writer._literal_sql
            monkeypatch.setattr(writer, "_literal_sql", lambda sql: (sent.append(sql), send(sql)))
            writer.emit([InsertIgnore("attempts", rows)])
            writer.flush()
            assert writer.statements == len(sent)
            assert all(len(sql) <= limit for sql in sent)
            # 100 rows of some 40 characters: one statement under the real limit, several
            # under 1,000 characters, none of which could have taken the next one's first row
            assert (len(sent) == 1) == (limit == 1_000_000)
            firsts = [sql.split(" VALUES ", 1)[1].split("), (", 1)[0] for sql in sent[1:]]
            assert all(len(a) + 2 + len(b) + 1 > limit
                       for a, b in zip(sent[:-1], firsts, strict=True))
            got = conn.execute(sa.text(
                "SELECT job_id, attempt_id, instance_name FROM attempts WHERE batch_id = :b "
                "ORDER BY job_id"), {"b": B}).all()
            assert [tuple(r) for r in got] == [
                (r["job_id"], r["attempt_id"], r["instance_name"]) for r in rows]
        finally:
            trans.rollback()


@pytest.mark.parametrize("no_backslash_escapes", [False, True], ids=["default", "nbe"])
@pytest.mark.parametrize("texts", [TRICKY, ["j1", "j2", "j3"], ["plain", "it's"]],
                         ids=["tricky", "plain", "one-quote"])
def test_varying_texts_round_trip(engine: sa.Engine, texts: list[str],
                                  no_backslash_escapes: bool) -> None:
    """A column of texts that differ from row to row (a bunch's job names) is rendered a
    column at a time: each reads back as itself, with or without a character to escape,
    whether or not the session treats backslashes as escapes."""
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        trans = conn.begin()
        try:
            writer = Writer(conn)
            writer.emit([InsertIgnore("attempts", [
                {"batch_id": B, "job_id": j, "attempt_id": "a", "instance_name": t,
                 "start_time_ms": j * 10**12, "reason": "same"}
                for j, t in enumerate(texts, 1)])])
            writer.flush()
            got = conn.execute(sa.text(
                "SELECT instance_name, start_time_ms, reason FROM attempts WHERE batch_id = :b "
                "ORDER BY job_id"), {"b": B}).all()
            assert [tuple(r) for r in got] == [(t, j * 10**12, "same")
                                               for j, t in enumerate(texts, 1)]
        finally:
            trans.rollback()


@pytest.mark.parametrize("op", [
    InsertIgnore("no_such_table", [{"batch_id": B, "job_id": 1}, {"batch_id": B, "job_id": 2}]),
    Update("attempts", {"no_such_column": 1}, {"batch_id": B, "job_id": 1, "attempt_id": "a"}),
], ids=["multi-row-insert", "deferred-update"])
def test_driver_errors_of_literal_statements_are_sqlalchemy_errors(engine: sa.Engine,
                                                                    op: Op) -> None:
    """Callers retry by SQLAlchemy's error classes (a deadlock, a lost server): a statement
    with literal values must not raise the driver's own exceptions past them."""
    with engine.connect() as conn:
        writer = Writer(conn)
        writer.emit([op])
        if isinstance(op, Update):  # two rows with these columns: one literal statement
            writer.emit([Update("attempts", {"no_such_column": 2},
                                {"batch_id": B, "job_id": 2, "attempt_id": "a"})])
        with pytest.raises(sa.exc.DBAPIError, match=r"1146|1054"):
            writer.flush()
        conn.rollback()


def test_literal_rows_follow_the_column_order(engine: sa.Engine) -> None:
    """One column or many, each row's literals come in the order of the columns asked for,
    whatever the order of the row's own keys."""
    with engine.connect() as conn:
        literals = Literals.of(conn)
        assert literals is not None
        rows = [{"b": "x'y", "a": 1, "c": None}, {"c": True, "a": 2, "b": "z"}]
        assert list(literals.rows(["a", "b", "c"], rows)) == [
            "(1, 'x\\'y', NULL)", "(2, 'z', 1)"]
        assert list(literals.rows(["b"], rows)) == ["('x\\'y')", "('z')"]
        with pytest.raises(ValueError, match="no columns"):
            list(literals.rows([], rows))


shared_values = st.sampled_from([0, 1, True, False, None, 7, "x", "x'y", "back\\slash"])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"a": shared_values, "b": shared_values,
                                       "c": shared_values}), min_size=1, max_size=6),
       st.permutations(["a", "b", "c"]))
def test_values_shared_by_every_row_are_rendered_once(
        engine: sa.Engine, rows: list[dict[str, object]], columns: list[str]) -> None:
    """Columns equal in every row move last and are rendered once: each row reads exactly as
    it would rendered value by value in the new column order."""
    with engine.connect() as conn:
        literals = Literals.of(conn)
        assert literals is not None
        ordered, parts = literals.rows_shared(columns, rows)
        assert sorted(ordered) == ["a", "b", "c"]
        assert list(parts) == list(literals.rows(ordered, rows))
        shared = [c for c in columns if all(r[c] == rows[0][c] for r in rows)]
        if len(rows) > 1:
            assert list(ordered) == [c for c in columns if c not in shared] + shared
        else:
            assert list(ordered) == columns


column_values = st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), min_size=8, max_size=8),
    st.lists(st.one_of(st.integers(-5, 5), st.booleans()), min_size=8, max_size=8),
    st.lists(st.text("abz09_-", max_size=6), min_size=8, max_size=8),
    st.lists(st.one_of(st.text(max_size=6), st.sampled_from(TRICKY)), min_size=8, max_size=8),
    st.lists(st.one_of(st.none(), st.integers(0, 9), st.text("ab'", max_size=3)),
             min_size=8, max_size=8))


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(column_values, min_size=1, max_size=3), st.booleans())
def test_columns_rendered_at_once_read_as_value_by_value(
        engine: sa.Engine, columns: list[list[object]], no_backslash_escapes: bool) -> None:
    """A varying column of ints, bools or texts rendered a column at a time gives each row
    exactly the literals it has rendered value by value, in either escaping mode."""
    names = [f"c{i}" for i in range(len(columns))]
    rows = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        literals = Literals.of(conn)
        assert literals is not None
        ordered, parts = literals.rows_shared(names, rows)  # type: ignore[arg-type]
        assert list(parts) == list(literals.rows(ordered, rows))  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"a": shared_values, "b": shared_values,
                                       "c": shared_values}), min_size=2, max_size=6),
       st.dictionaries(st.sampled_from(["b", "c"]), shared_values))
def test_shared_values_at_their_default_are_left_out(
        engine: sa.Engine, rows: list[dict[str, object]], defaults: dict[str, object]) -> None:
    """A shared column is left out exactly when its value is its default, of the same kind
    (0 and False are one kind, a TINYINT; None and "x" are not 0); the rest read as before."""
    with engine.connect() as conn:
        literals = Literals.of(conn)
        assert literals is not None
        ordered, parts = literals.rows_shared(["a", "b", "c"], rows, defaults)  # type: ignore[arg-type]
        left_out = {c for c in ("a", "b", "c") if c not in ordered}
        for c in ("a", "b", "c"):
            values = [r[c] for r in rows]
            at_default = c in defaults and all(
                v == defaults[c] and (v is None) == (defaults[c] is None)
                and isinstance(v, str) == isinstance(defaults[c], str) for v in values)
            assert (c in left_out) == at_default, (c, values, defaults)
        assert list(parts) == list(literals.rows(ordered, rows))


def test_column_defaults_are_the_schemas(engine: sa.Engine) -> None:
    """Every default the writer may leave a column to is the one the table itself gives."""
    required = {"jobs": {"batch_id": B, "job_id": 77, "update_id": 1, "job_group_id": 0,
                         "cores_mcpu": 1000, "inst_coll": "standard"}}
    assert set(required) == set(COLUMN_DEFAULTS)
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            for table, defaults in COLUMN_DEFAULTS.items():
                row = required[table]
                conn.execute(sa.text(f"INSERT INTO {table} ({', '.join(row)}) VALUES "
                                     f"({', '.join(f':{c}' for c in row)})"), row)
                got = conn.execute(sa.text(
                    f"SELECT {', '.join(defaults)} FROM {table} WHERE "
                    + " AND ".join(f"{c} = :{c}" for c in row)), row).one()
                assert dict(zip(defaults, got, strict=True)) == defaults
        finally:
            trans.rollback()


def test_job_rows_at_defaults_read_back_with_their_own_values(engine: sa.Engine) -> None:
    """Bunches whose rows share default values (left out) or non-default ones (kept) land
    with each row's own values."""
    def job(j: int, **values: object) -> dict[str, object]:
        return {"batch_id": B, "job_id": j, "update_id": 1, "job_group_id": 0,
                "state": "Pending", "n_pending_parents": 1, "always_run": False,
                "n_max_attempts": 20, "cores_mcpu": 1000, "memory_bytes": 0,
                "storage_gib": 0, "machine_type": None, "preemptible": True, "regions": None,
                "inst_coll": "standard", "name": f"j{j}", **values}
    bunches = [[job(j) for j in range(1, 4)],
               [job(j, state="Ready", n_pending_parents=0, always_run=True, n_max_attempts=3,
                    memory_bytes=10, storage_gib=5, machine_type="n1", preemptible=False,
                    regions='["r"]') for j in range(4, 7)],
               [job(7, always_run=True), job(8, machine_type="n2")]]
    cols = list(bunches[0][0])
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            writer = Writer(conn)
            for rows in bunches:
                writer.emit([InsertIgnore("jobs", rows)])
                writer.flush()
            got = conn.execute(sa.text(
                f"SELECT {', '.join(cols)} FROM jobs WHERE batch_id = :b ORDER BY job_id"),
                {"b": B}).all()
            assert [dict(zip(cols, r, strict=True)) for r in got] == [
                row for rows in bunches for row in rows]
        finally:
            trans.rollback()


def test_job_rows_of_a_bunch_read_back_with_their_own_values(engine: sa.Engine) -> None:
    """A bunch's job rows (most columns shared, two not) land with each row's values."""
    rows = [{"batch_id": B, "job_id": j, "update_id": 1, "job_group_id": 0, "state": "Ready",
             "cores_mcpu": 1000, "inst_coll": "standard", "name": None if j == 3 else f"j'{j}"}
            for j in range(1, 6)]
    with engine.connect() as conn:
        trans = conn.begin()
        try:
            writer = Writer(conn)
            writer.emit([InsertIgnore("jobs", rows)])
            writer.flush()
            got = conn.execute(sa.text(
                "SELECT job_id, name, state, cores_mcpu, inst_coll FROM jobs WHERE batch_id = :b "
                "ORDER BY job_id"), {"b": B}).all()
            assert [tuple(r) for r in got] == [
                (j, None if j == 3 else f"j'{j}", "Ready", 1000, "standard") for j in range(1, 6)]
        finally:
            trans.rollback()


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab'\"\\\0\n\r\x1a\t%é")), max_size=40)
       | st.text(max_size=200))
def test_escape_text_is_pymysqls_escape_string(value: str) -> None:
    """The writer's string escaping gives exactly what PyMySQL's does (round trips above)."""
    assert escape_text(value) == escape_string(value)
