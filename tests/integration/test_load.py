"""Loading rows from files: exact values back, strict about what the server would only warn."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.billing import JobUsage, UsageTexts
from core.projection.ops import Increment, InsertIgnore, Op, Row
from services.audit.bulk import _write, split_loads
from services.audit.load import (
    CONNECT_ARGS,
    LoadError,
    NotLoadable,
    can_load,
    column,
    lines,
    load,
    text,
)
from services.audit.replay import ReplayStats
from services.common.settings import DatabaseSettings
from tests.integration.sql_modes import escapes_mode

pytestmark = pytest.mark.integration

TABLE = "hs_load_test"
TRICKY = ["%s", "it's \"q\"", "back\\slash\\", "tab\tnl\nr\r", "ünï 😀", "nul\x00z",
          "\\N", "N", "\x1a;--", "", "  padded  "]


@pytest.fixture(scope="module")
def engine(migrated_db: DatabaseSettings) -> Iterator[sa.Engine]:
    engine = sa.create_engine(migrated_db.url(), connect_args=CONNECT_ARGS)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {TABLE}")
        conn.exec_driver_sql(f"CREATE TABLE {TABLE} (id INT NOT NULL PRIMARY KEY, s TEXT NULL, "
                             "n BIGINT NULL, flag BOOLEAN NULL, short VARCHAR(4) NULL) "
                             "DEFAULT CHARSET=utf8mb4")
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {TABLE}")
    engine.dispose()


def _read(conn: sa.Connection) -> list[tuple[object, ...]]:
    return [tuple(r) for r in conn.exec_driver_sql(
        f"SELECT id, s, n, flag, short FROM {TABLE} ORDER BY id")]


@pytest.mark.parametrize("no_backslash_escapes", [False, True], ids=["default", "nbe"])
def test_values_read_back_exactly(engine: sa.Engine, no_backslash_escapes: bool) -> None:
    rows: list[Row] = [
        {"id": i, "s": s, "n": n, "flag": flag, "short": short}
        for i, (s, n, flag, short) in enumerate([
            *((t, i, i % 2 == 0, None) for i, t in enumerate(TRICKY)),
            (None, None, None, "abcd"), ("x", -(2 ** 63), True, ""),
            ("y", 2 ** 63 - 1, False, "1")])]
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        trans = conn.begin()
        try:
            assert can_load(conn)
            load(conn, TABLE, rows)
            assert _read(conn) == [
                (r["id"], r["s"], r["n"], None if r["flag"] is None else int(bool(r["flag"])),
                 r["short"]) for r in rows]
        finally:
            trans.rollback()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.text(max_size=30)), min_size=1, max_size=8))
def test_any_text_reads_back(engine: sa.Engine, texts: list[str | None]) -> None:
    rows: list[Row] = [{"id": i, "s": t} for i, t in enumerate(texts)]
    with engine.connect() as conn, conn.begin() as trans:
        load(conn, TABLE, rows)
        got = [s for _, s, *_ in _read(conn)]
        trans.rollback()
    # MariaDB's utf8mb4 stores every code point but the surrogates (not valid UTF-8).
    assert got == texts


@pytest.mark.parametrize(("rows", "why"), [
    ([{"id": 1, "short": "x"}, {"id": 1, "short": "y"}], "Duplicate entry"),
    ([{"id": 1, "short": "too long"}], "short"),
    ([{"id": 1, "short": "x"}, {"id": 2, "short": "too long"}], "short"),
], ids=["duplicate-key", "too-long-shared", "too-long"])
def test_what_the_server_only_warns_about_fails_the_load(engine: sa.Engine, rows: list[Row],
                                                        why: str) -> None:
    """LOCAL makes the server skip such rows with a warning; a load raises instead, and the
    transaction leaves nothing behind."""
    with engine.connect() as conn:
        with pytest.raises(LoadError, match=why), conn.begin():
            conn.exec_driver_sql(f"INSERT INTO {TABLE} (id) VALUES (99)")
            load(conn, TABLE, rows)
        assert _read(conn) == []


def test_values_without_a_text_form_are_refused_before_anything_is_sent(
        engine: sa.Engine) -> None:
    with engine.connect() as conn, conn.begin():
        with pytest.raises(NotLoadable, match="float"):
            load(conn, TABLE, [{"id": 1, "n": 1}, {"id": 2, "n": 1.5}])
        assert _read(conn) == []
    with pytest.raises(TypeError):
        lines(["a"], [{"a": b"x"}])
    with pytest.raises(TypeError, match="bytes"):
        lines(["a"], [{"a": b"x"}, {"a": b"x"}])  # the same in every row: refused all the same


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                    st.sampled_from(TRICKY))


@given(st.integers(1, 12).flatmap(lambda n: st.lists(
    st.one_of(st.lists(_VALUES, min_size=n, max_size=n),  # a column of any values
              _VALUES.map(lambda v: [v] * n)),  # a column of one value
    min_size=1, max_size=6)))
def test_every_line_holds_its_rows_values(table: list[list[object]]) -> None:
    """Whatever columns are shared or not, each line and the shared values make the row."""
    columns = [f"c{i}" for i in range(len(table))]
    rows: list[Row] = [dict(zip(columns, values, strict=True))
                       for values in zip(*table, strict=True)]
    order, got, shared, computed = lines(columns, rows)
    assert computed == ()  # no usages here
    assert order[0] == columns[0] and sorted(order + [c for c, _ in shared]) == columns
    assert [c for c in columns if c in order] == order  # the file keeps the given order
    assert [{**dict(zip(order, line[:-1].split("\t"), strict=True)),
             **{c: text(v) for c, v in shared}} for line in got] == [
        {c: text(row[c]) for c in columns} for row in rows]
    for c, v in shared:
        assert all(type(row[c]) is type(v) and row[c] == v for row in rows)


def test_columns_of_one_value_are_left_to_the_statement_but_the_first() -> None:
    rows: list[Row] = [{"b": None, "a": True, "c": 7, "d": "s"},
                       {"a": 1, "b": "t\tx", "c": 7, "d": "s"}]
    assert lines(["c", "a", "d", "b"], rows) == (
        ["c", "a", "b"], ["7\t1\t\\N\n", "7\t1\tt\\tx\n"], [("d", "s")], ())
    assert lines(["c", "d"], rows) == (["c"], ["7\n", "7\n"], [("d", "s")], ())
    assert lines(["b"], rows) == (["b"], ["\\N\n", "t\\tx\n"], [], ())


@pytest.mark.parametrize("no_backslash_escapes", [False, True], ids=["default", "nbe"])
@pytest.mark.parametrize("shared", [*TRICKY, None], ids=repr)
def test_a_value_every_row_shares_reads_back_exactly(engine: sa.Engine, shared: str | None,
                                                     no_backslash_escapes: bool) -> None:
    """Set by the statement, quoted by the driver, in either sql_mode: the same values."""
    rows: list[Row] = [{"id": i, "s": shared, "n": 7, "flag": True, "short": "ab"}
                       for i in range(3)]
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        trans = conn.begin()
        try:
            load(conn, TABLE, rows)
            assert _read(conn) == [(i, shared, 7, 1, "ab") for i in range(3)]
        finally:
            trans.rollback()


@given(st.lists(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                         st.sampled_from(TRICKY)), min_size=1, max_size=30))
def test_a_column_renders_as_its_values_one_by_one(values: list[object]) -> None:
    """The column-at-a-time rendering is the value-at-a-time one, whatever the column holds."""
    assert column(values) == [text(v) for v in values]
    for kinds in ([v for v in values if type(v) in (int, bool) or v is None] or [None],
                  [v for v in values if type(v) is str or v is None] or [None]):
        assert column(kinds) == [text(v) for v in kinds]


@pytest.mark.parametrize("odd", [1.5, b"x", Decimal(1), ["a"]], ids=repr)
def test_a_column_with_a_value_without_a_text_form_is_refused(odd: object) -> None:
    with pytest.raises(TypeError, match=type(odd).__name__):
        column([1, None, odd, "a"])


def test_rows_that_cannot_be_loaded_are_inserted(engine: sa.Engine) -> None:
    """The bulk lane's write: loadable rows loaded, the others through the writer."""
    stats = ReplayStats()
    ops: list[Op] = [InsertIgnore("attempts", [{"batch_id": 990_002, "job_id": 1,
                                                "attempt_id": "a", "start_time_ms": 5}]),
                     InsertIgnore("aggregated_batch_resources", [{
                         "batch_id": 990_002, "resource": "r", "token": 1,
                         "resource_usage": Decimal(3)}])]
    try:
        _write(engine, ops, stats)
        assert stats.loaded == 1
        with engine.connect() as conn:
            assert conn.exec_driver_sql(
                "SELECT a.start_time_ms, r.resource_usage FROM attempts a "
                "JOIN aggregated_batch_resources r USING (batch_id) "
                "WHERE batch_id = 990002").all() == [(5, 3)]
    finally:
        with engine.begin() as conn:
            for table in ("attempts", "aggregated_batch_resources"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE batch_id = 990002")


def test_a_connection_without_consent_does_not_load(migrated_db: DatabaseSettings) -> None:
    plain = sa.create_engine(migrated_db.url())
    try:
        with plain.connect() as conn:
            assert not can_load(conn)
    finally:
        plain.dispose()


def test_only_new_rows_of_batch_tables_of_one_shape_are_loaded() -> None:
    jobs_a = InsertIgnore("jobs", [{"batch_id": 1, "job_id": 1}])
    jobs_b = InsertIgnore("jobs", [{"batch_id": 2, "job_id": 1}])
    other_shape = InsertIgnore("jobs", [{"batch_id": 3, "job_id": 1, "state": "Ready"}])
    unkeyed = InsertIgnore("users", [{"user": "u"}])
    inc = Increment("event_rates", {"minute": 1, "kind": "SJ", "token": 0}, {"n": 1})
    ops: list[Op] = [jobs_a, unkeyed, inc, jobs_b, other_shape]
    rest, loads = split_loads(ops)
    assert loads == {"jobs": [*jobs_a.rows, *jobs_b.rows]}
    assert rest == [unkeyed, inc, other_shape]


def test_no_scratch_space_means_the_rows_are_inserted_instead(engine: sa.Engine,
                                                             tmp_path: Path) -> None:
    with engine.connect() as conn, conn.begin():
        with pytest.raises(NotLoadable, match="no file"):
            load(conn, TABLE, [{"id": 1, "s": "x"}], scratch=str(tmp_path / "missing"))
        assert _read(conn) == []


_NAMES = ["compute/n1-standard/1", "it's \"q\"", "back\\slash\\", "50% %d %s", "ünï 😀",
          "tab\tnl\n"]


def _usages(quantities: tuple[tuple[str, int], ...], durations: list[int | None]
            ) -> list[JobUsage | None]:
    texts = UsageTexts()
    return [None if ms is None else texts.usage(quantities, ms) for ms in durations]


@pytest.mark.parametrize("no_backslash_escapes", [False, True], ids=["default", "nbe"])
def test_usages_of_one_format_are_rendered_by_the_server_as_their_texts(
        engine: sa.Engine, no_backslash_escapes: bool) -> None:
    quantities = tuple((name, q) for name, q in zip(_NAMES, [1000, 64, 0, 7, 3, 2**20],
                                                    strict=True))
    usages = _usages(quantities, [40_964, None, 1, 2**40, 123_456_789])
    rows: list[Row] = [{"id": i, "s": u, "n": 7} for i, u in enumerate(usages)]
    got = lines(["id", "s", "n"], rows)
    assert got.computed and got.computed[0][0] == "s"  # the milliseconds go in the file
    with engine.connect() as conn, escapes_mode(conn, no_backslash_escapes):
        trans = conn.begin()
        try:
            load(conn, TABLE, rows)
            assert [r[1] for r in _read(conn)] == [None if u is None else u.text()
                                                  for u in usages]
        finally:
            trans.rollback()


@pytest.mark.parametrize("case", ["two formats", "beyond BIGINT", "beside a text"])
def test_other_usage_columns_are_loaded_as_texts(engine: sa.Engine, case: str) -> None:
    one = _usages((("compute/1", 1000),), [5, 6])
    other = _usages((("compute/1", 1000), ("memory/1", 3)), [7])
    big = _usages((("compute/1", 2**40),), [2**30])
    values: list[object] = {"two formats": [*one, *other], "beyond BIGINT": [*one, *big],
                            "beside a text": [*one, '[["x",1]]']}[case]
    rows: list[Row] = [{"id": i, "s": v} for i, v in enumerate(values)]  # type: ignore[misc]
    assert lines(["id", "s"], rows).computed == ()
    with engine.connect() as conn, conn.begin():
        load(conn, TABLE, rows)
        assert [r[1] for r in _read(conn)] == [v.text() if isinstance(v, JobUsage) else v
                                              for v in values]
        conn.rollback()


def test_usages_written_without_a_load_are_their_texts(migrated_db: DatabaseSettings) -> None:
    """A server or driver that cannot load: the writer inserts the usages' texts."""
    plain = sa.create_engine(migrated_db.url())
    usages = _usages((("compute/1", 1000), ("ip-fee/1", 2)), [11, 12])
    ops: list[Op] = [InsertIgnore(TABLE, [{"id": 100 + i, "s": u, "n": 1}
                                          for i, u in enumerate(usages)])]
    try:
        _write(plain, ops, ReplayStats())
        with plain.connect() as conn:
            assert [r[1] for r in _read(conn) if r[0] >= 100] == [
                u.text() for u in usages if u is not None]
    finally:
        with plain.begin() as conn:
            conn.exec_driver_sql(f"DELETE FROM {TABLE} WHERE id >= 100")
        plain.dispose()
