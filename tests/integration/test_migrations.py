"""The migration runner and the projection schema, against the real MariaDB."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from core.billing import resources_of_text, resources_text, usage_of_text, usage_text
from services.common.settings import DatabaseSettings
from sql.migrate import (
    MIGRATIONS_DIR,
    MigrationError,
    apply_migrations,
    discover,
    migration_status,
    split_statements,
    unsupported_server,
)

pytestmark = pytest.mark.integration

ALL_VERSIONS = [m.version for m in discover()]

KEY_TABLES = {
    "schema_migrations", "applied_offsets", "id_sequences",
    "users", "auth_tokens", "billing_projects", "billing_project_users", "resources",
    "batches", "batch_attributes", "batch_updates", "job_groups", "job_group_self_and_ancestors",
    "job_group_attributes", "jobs", "job_parents", "job_attributes", "attempts",
    "job_group_job_counts", "batches_cancelled", "job_groups_cancelled",
    "user_inst_coll_resources", "job_group_inst_coll_cancellable_resources",
    "aggregated_job_group_resources", "aggregated_batch_resources",
    "aggregated_billing_project_resources", "aggregated_billing_project_user_resources_by_date",
    "aggregated_user_resources",
    "instances", "inst_colls", "callback_deliveries", "scheduler_epochs",
    "user_waiting_reasons", "job_waiting_reasons", "waiting_reasons_epoch", "event_rates",
}

TOKENIZED_TABLES = {
    "user_inst_coll_resources", "job_group_inst_coll_cancellable_resources",
    "aggregated_job_group_resources", "aggregated_batch_resources",
    "aggregated_billing_project_resources", "aggregated_billing_project_user_resources_by_date",
    "aggregated_user_resources", "event_rates",
}

# Reserved words of MySQL 8.0 (INFORMATION_SCHEMA.KEYWORDS WHERE RESERVED): none may name a table
# or a column, so that SQL written against MariaDB needs no quoting on MySQL 8.
_MYSQL8_RESERVED_TEXT = """
ACCESSIBLE ADD ALL ALTER ANALYZE AND AS ASC ASENSITIVE BEFORE BETWEEN BIGINT BINARY BLOB BOTH BY
CALL CASCADE CASE CHANGE CHAR CHARACTER CHECK COLLATE COLUMN CONDITION CONSTRAINT CONTINUE
CONVERT CREATE CROSS CUBE CUME_DIST CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP CURRENT_USER
CURSOR DATABASE DATABASES DAY_HOUR DAY_MICROSECOND DAY_MINUTE DAY_SECOND DEC DECIMAL DECLARE
DEFAULT DELAYED DELETE DENSE_RANK DESC DESCRIBE DETERMINISTIC DISTINCT DISTINCTROW DIV DOUBLE
DROP DUAL EACH ELSE ELSEIF EMPTY ENCLOSED ESCAPED EXCEPT EXISTS EXIT EXPLAIN FALSE FETCH
FIRST_VALUE FLOAT FLOAT4 FLOAT8 FOR FORCE FOREIGN FROM FULLTEXT FUNCTION GENERATED GET GRANT
GROUP GROUPING GROUPS HAVING HIGH_PRIORITY HOUR_MICROSECOND HOUR_MINUTE HOUR_SECOND IF IGNORE IN
INDEX INFILE INNER INOUT INSENSITIVE INSERT INT INT1 INT2 INT3 INT4 INT8 INTEGER INTERSECT
INTERVAL INTO IO_AFTER_GTIDS IO_BEFORE_GTIDS IS ITERATE JOIN JSON_TABLE KEY KEYS KILL LAG
LAST_VALUE LATERAL LEAD LEADING LEAVE LEFT LIKE LIMIT LINEAR LINES LOAD LOCALTIME LOCALTIMESTAMP
LOCK LONG LONGBLOB LONGTEXT LOOP LOW_PRIORITY MASTER_BIND MASTER_SSL_VERIFY_SERVER_CERT MATCH
MAXVALUE MEDIUMBLOB MEDIUMINT MEDIUMTEXT MEMBER MIDDLEINT MINUTE_MICROSECOND MINUTE_SECOND MOD
MODIFIES NATURAL NOT NO_WRITE_TO_BINLOG NTH_VALUE NTILE NULL NUMERIC OF ON OPTIMIZE
OPTIMIZER_COSTS OPTION OPTIONALLY OR ORDER OUT OUTER OUTFILE OVER PARTITION PERCENT_RANK
PRECISION PRIMARY PROCEDURE PURGE RANGE RANK READ READS READ_WRITE REAL RECURSIVE REFERENCES
REGEXP RELEASE RENAME REPEAT REPLACE REQUIRE RESIGNAL RESTRICT RETURN REVOKE RIGHT RLIKE ROW ROWS
ROW_NUMBER SCHEMA SCHEMAS SECOND_MICROSECOND SELECT SENSITIVE SEPARATOR SET SHOW SIGNAL SMALLINT
SPATIAL SPECIFIC SQL SQLEXCEPTION SQLSTATE SQLWARNING SQL_BIG_RESULT SQL_CALC_FOUND_ROWS
SQL_SMALL_RESULT SSL STARTING STORED STRAIGHT_JOIN SYSTEM TABLE TERMINATED THEN TINYBLOB TINYINT
TINYTEXT TO TRAILING TRIGGER TRUE UNDO UNION UNIQUE UNLOCK UNSIGNED UPDATE USAGE USE USING
UTC_DATE UTC_TIME UTC_TIMESTAMP VALUES VARBINARY VARCHAR VARCHARACTER VARYING VIRTUAL WHEN WHERE
WHILE WINDOW WITH WRITE XOR YEAR_MONTH ZEROFILL
"""
MYSQL8_RESERVED = frozenset(_MYSQL8_RESERVED_TEXT.split())


def _query(db: DatabaseSettings, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(db.url(database=False))
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def _tables(db: DatabaseSettings) -> set[str]:
    rows = _query(db, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = :d",
                  d=db.name)
    return {r[0] for r in rows}


def _recorded(db: DatabaseSettings) -> list[tuple[Any, ...]]:
    return _query(db, f"SELECT version, name, checksum, applied_at FROM `{db.name}`."
                      "schema_migrations ORDER BY version")


def _snapshot(db: DatabaseSettings) -> tuple[list[tuple[Any, ...]], ...]:
    columns = _query(
        db,
        "SELECT TABLE_NAME, ORDINAL_POSITION, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, "
        "COLUMN_DEFAULT, COLLATION_NAME, EXTRA FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = :d ORDER BY TABLE_NAME, ORDINAL_POSITION", d=db.name)
    indexes = _query(
        db,
        "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME, NON_UNIQUE, SUB_PART "
        "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = :d "
        "ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX", d=db.name)
    return columns, indexes, _recorded(db)


def _write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


SMALL = {
    "001-first.sql": "-- a comment\nCREATE TABLE a (\n  id BIGINT NOT NULL PRIMARY KEY,\n"
                     "  note VARCHAR(100) NULL\n) ENGINE=InnoDB;\n"
                     # '%' and ':name' must reach the server verbatim (no parameter syntax)
                     "INSERT INTO a (id, note) VALUES (1, '50% :x');\n",
    "002-second.sql": "CREATE TABLE b (id BIGINT NOT NULL PRIMARY KEY) ENGINE=InnoDB;\n",
}


def _versions(db: DatabaseSettings) -> list[int]:
    return [r[0] for r in _recorded(db)]


# --- the real migrations ------------------------------------------------------------------------

def test_apply_to_empty_database(empty_db: DatabaseSettings) -> None:
    assert apply_migrations(empty_db) == ALL_VERSIONS
    assert ALL_VERSIONS[:5] == [1, 2, 3, 4, 5]
    assert KEY_TABLES - _tables(empty_db) == set()
    assert _versions(empty_db) == ALL_VERSIONS
    columns = _query(
        empty_db,
        "SELECT COLUMN_NAME, DATA_TYPE, CHARACTER_MAXIMUM_LENGTH, IS_NULLABLE, COLUMN_KEY "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :d "
        "AND TABLE_NAME = 'applied_offsets' ORDER BY ORDINAL_POSITION",
        d=empty_db.name)
    assert columns == [
        ("consumer", "varchar", 100, "NO", "PRI"),
        ("topic", "varchar", 200, "NO", "PRI"),
        ("kafka_partition", "int", None, "NO", "PRI"),
        ("next_offset", "bigint", None, "NO", ""),
        ("updated_at_ms", "bigint", None, "NO", ""),
    ]


def test_job_names_move_to_the_jobs_row(empty_db: DatabaseSettings, tmp_path: Path) -> None:
    """013 moves names projected as job_attributes rows to the jobs.name column."""
    before = tmp_path / "before"
    before.mkdir()
    for m in discover():
        if m.version < 13:
            shutil.copy(MIGRATIONS_DIR / m.name, before / m.name)
    apply_migrations(empty_db, before)
    engine = sa.create_engine(empty_db.url())
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, cores_mcpu, "
                "inst_coll) VALUES (1, :j, 1, 0, 1000, 'standard')"), [{"j": 1}, {"j": 2}])
            conn.execute(sa.text(
                "INSERT INTO job_attributes (batch_id, job_id, attr_key, attr_value) "
                "VALUES (1, :j, :k, :v)"),
                [{"j": 1, "k": "name", "v": "first"}, {"j": 1, "k": "team", "v": "gen"},
                 {"j": 2, "k": "team", "v": "other"}])
        assert apply_migrations(empty_db) == [v for v in ALL_VERSIONS if v >= 13]
        with engine.connect() as conn:
            names = conn.execute(sa.text("SELECT job_id, name FROM jobs ORDER BY job_id"))
            assert [tuple(r) for r in names] == [(1, "first"), (2, None)]
            attrs = conn.execute(sa.text(
                "SELECT job_id, attr_key, attr_value FROM job_attributes ORDER BY job_id"))
            assert [tuple(r) for r in attrs] == [(1, "team", "gen"), (2, "team", "other")]
    finally:
        engine.dispose()


def test_attempt_resources_move_to_the_attempts_row(empty_db: DatabaseSettings,
                                                   tmp_path: Path) -> None:
    """014 moves attempt_resources rows to attempts.resources, as the projector writes it."""
    before = tmp_path / "before"
    before.mkdir()
    for m in discover():
        if m.version < 14:
            shutil.copy(MIGRATIONS_DIR / m.name, before / m.name)
    apply_migrations(empty_db, before)
    engine = sa.create_engine(empty_db.url())
    got = {"compute/n1-standard/1": 1000, "memory/n1-standard/1": 3840, "service-fee/1": 1000,
           "ip-fee/1024/1": 64}
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO attempts (batch_id, job_id, attempt_id) VALUES (1, :j, :a)"),
                [{"j": 1, "a": "x"}, {"j": 1, "a": "y"}, {"j": 2, "a": "x"}])
            conn.execute(sa.text(
                "INSERT INTO attempt_resources (batch_id, job_id, attempt_id, resource, "
                "quantity) VALUES (1, :j, :a, :r, :q)"),
                [{"j": 1, "a": "x", "r": r, "q": q} for r, q in got.items()]
                + [{"j": 2, "a": "x", "r": "service-fee/1", "q": 250}])
        assert apply_migrations(empty_db) == [v for v in ALL_VERSIONS if v >= 14]
        assert "attempt_resources" not in _tables(empty_db)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text(
                "SELECT job_id, attempt_id, resources FROM attempts ORDER BY job_id, attempt_id"))]
        assert rows == [(1, "x", resources_text(got)), (1, "y", None),
                        (2, "x", resources_text({"service-fee/1": 250}))]
        assert resources_of_text(rows[0][2]) == got
    finally:
        engine.dispose()


def test_job_usage_moves_to_the_jobs_row(empty_db: DatabaseSettings, tmp_path: Path) -> None:
    """015 moves aggregated_job_resources rows to jobs.resource_usage, as the projector
    writes it (pairs sorted by resource as bytes, no zero usage)."""
    before = tmp_path / "before"
    before.mkdir()
    for m in discover():
        if m.version < 15:
            shutil.copy(MIGRATIONS_DIR / m.name, before / m.name)
    apply_migrations(empty_db, before)
    engine = sa.create_engine(empty_db.url())
    got = {"service-fee/1": 9_000, "compute/n1-standard/1": 1_000_000_000_000,
           "memory/n1-standard/1": 3_840, "ip-fee/1024/1": 64, "disk/pd-ssd/1": 0}
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, cores_mcpu, "
                "inst_coll) VALUES (1, :j, 1, 0, 1000, 'standard')"), [{"j": j} for j in (1, 2, 3)])
            conn.execute(sa.text(
                "INSERT INTO aggregated_job_resources (batch_id, job_id, resource, "
                "resource_usage) VALUES (1, :j, :r, :u)"),
                [{"j": 1, "r": r, "u": u} for r, u in got.items()]
                + [{"j": 3, "r": "compute/n1-standard/1", "u": 0}])
        assert apply_migrations(empty_db) == [v for v in ALL_VERSIONS if v >= 15]
        assert "aggregated_job_resources" not in _tables(empty_db)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(sa.text(
                "SELECT job_id, resource_usage FROM jobs ORDER BY job_id"))]
        assert rows == [(1, usage_text(got)), (2, None), (3, None)]
        assert usage_of_text(rows[0][1]) == {r: u for r, u in got.items() if u}
    finally:
        engine.dispose()


def test_rerun_changes_nothing(migrated_db: DatabaseSettings) -> None:
    before = _snapshot(migrated_db)
    assert apply_migrations(migrated_db) == []
    assert _snapshot(migrated_db) == before


def test_status(migrated_db: DatabaseSettings, empty_db: DatabaseSettings) -> None:
    applied = migration_status(migrated_db)
    assert [s.version for s in applied] == ALL_VERSIONS
    assert all(s.applied_at is not None for s in applied)
    assert all(s.applied_at is None for s in migration_status(empty_db))
    assert _query(empty_db, "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :d",
                  d=empty_db.name) == []  # status never creates the database


def test_schema_follows_the_compatibility_rules(migrated_db: DatabaseSettings) -> None:
    d = migrated_db.name
    tables = _query(migrated_db, "SELECT TABLE_NAME, ENGINE, TABLE_COLLATION "
                    "FROM information_schema.TABLES WHERE TABLE_SCHEMA = :d", d=d)
    assert {(engine, collation) for _, engine, collation in tables} == {("InnoDB", "utf8mb4_bin")}
    columns = _query(migrated_db, "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE "
                     "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :d", d=d)
    names = {t for t, *_ in tables} | {c for _, c, _ in columns}
    assert sorted(n for n in names if n.upper() in MYSQL8_RESERVED) == []
    # times are BIGINT ms (the runner's own applied_at aside); JSON is text, never JSON
    assert [(t, c) for t, c, ty in columns
            if ty in ("datetime", "timestamp", "json") and t != "schema_migrations"] == []
    assert _query(migrated_db, "SELECT CONSTRAINT_NAME FROM information_schema."
                  "REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = :d", d=d) == []
    primary = _query(migrated_db, "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema."
                     "STATISTICS WHERE TABLE_SCHEMA = :d AND INDEX_NAME = 'PRIMARY'", d=d)
    assert {t for t, _ in primary} == {t for t, *_ in tables}  # every table has a primary key
    assert {t for t, c in primary if c == "token"} == TOKENIZED_TABLES


def test_concurrent_runners_apply_each_version_once(empty_db: DatabaseSettings) -> None:
    barrier = threading.Barrier(2)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(apply_migrations(empty_db))
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == [[], ALL_VERSIONS]
    assert _versions(empty_db) == ALL_VERSIONS


# --- forward-only checks, on small migration directories ----------------------------------------

def test_changed_checksum_raises(empty_db: DatabaseSettings, tmp_path: Path) -> None:
    directory = _write(tmp_path / "m", SMALL)
    assert apply_migrations(empty_db, directory) == [1, 2]
    assert _query(empty_db, f"SELECT note FROM `{empty_db.name}`.a") == [("50% :x",)]
    (directory / "001-first.sql").write_text(SMALL["001-first.sql"] + "-- edited\n")
    with pytest.raises(MigrationError, match=r"001-first\.sql changed after it was applied"):
        apply_migrations(empty_db, directory)


def test_applied_file_missing_raises(empty_db: DatabaseSettings, tmp_path: Path) -> None:
    directory = _write(tmp_path / "m", SMALL)
    apply_migrations(empty_db, directory)
    (directory / "002-second.sql").unlink()
    with pytest.raises(MigrationError, match=r"migration 2 \(002-second\.sql\) is applied"):
        apply_migrations(empty_db, directory)
    with pytest.raises(MigrationError, match="file is gone"):
        migration_status(empty_db, directory)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"001-a.sql": "SELECT 1;\n", "001-b.sql": "SELECT 2;\n"}, "duplicate migration version 1"),
        ({"1-a.sql": "SELECT 1;\n"}, "named NNN-description.sql"),
        ({"000-a.sql": "SELECT 1;\n"}, "named NNN-description.sql"),
        ({"001-a.sql": "SELECT 1"}, "001-a.sql: unterminated statement"),
    ],
    ids=["duplicate-version", "misnamed", "version-zero", "unterminated"],
)
def test_bad_files_raise_before_touching_the_server(
    empty_db: DatabaseSettings, tmp_path: Path, files: dict[str, str], message: str
) -> None:
    with pytest.raises(MigrationError, match=message):
        apply_migrations(empty_db, _write(tmp_path / "m", files))
    assert empty_db.name not in {r[0] for r in _query(empty_db, "SHOW DATABASES")}


def test_pending_file_below_applied_raises(empty_db: DatabaseSettings, tmp_path: Path) -> None:
    directory = _write(tmp_path / "m", {"002-second.sql": SMALL["002-second.sql"]})
    apply_migrations(empty_db, directory)
    _write(directory, {"001-first.sql": SMALL["001-first.sql"]})
    with pytest.raises(MigrationError, match="renumber it above 2"):
        apply_migrations(empty_db, directory)


def test_failing_migration_records_nothing_for_it(
    empty_db: DatabaseSettings, tmp_path: Path
) -> None:
    bad = "CREATE TABLE c (id BIGINT NOT NULL PRIMARY KEY) ENGINE=InnoDB;\nCREATE TABLE oops (;\n"
    directory = _write(tmp_path / "m", {**SMALL, "003-bad.sql": bad,
                                        "004-later.sql": "CREATE TABLE d (id INT PRIMARY KEY);\n"})
    with pytest.raises(MigrationError, match=r"003-bad\.sql: statement 2 of 2 failed"):
        apply_migrations(empty_db, directory)
    assert _versions(empty_db) == [1, 2]
    tables = _tables(empty_db)
    assert {"a", "b", "c"} <= tables  # DDL is not transactional: c stays, loudly documented
    assert "d" not in tables
    # Fixing the file and rerunning fails loudly on the half-applied part, never silently.
    (directory / "003-bad.sql").write_text(bad.replace("CREATE TABLE oops (;", "SELECT 1;"))
    with pytest.raises(MigrationError, match="already exists"):
        apply_migrations(empty_db, directory)
    assert _versions(empty_db) == [1, 2]


# --- the splitter -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("-- only a comment\n\n", []),
        ("SELECT 1;\nSELECT 2;  \n", ["SELECT 1", "SELECT 2"]),
        ("CREATE TABLE t (\n  -- why\n  a INT\n) ENGINE=InnoDB;\n",
         ["CREATE TABLE t (\n  a INT\n) ENGINE=InnoDB"]),
        ("INSERT INTO t VALUES ('a;b');\n", ["INSERT INTO t VALUES ('a;b')"]),
        ("  ;\nSELECT 1;", ["SELECT 1"]),
    ],
    ids=["empty", "comment", "two", "inner-comment", "inner-semicolon", "empty-statement"],
)
def test_split_statements(text: str, expected: Sequence[str]) -> None:
    assert split_statements(text) == expected


@pytest.mark.parametrize("version", [
    "10.11.19-MariaDB-0+deb12u1", "10.11.3-MariaDB", "10.6.13-MariaDB-log", "11.0.2-MariaDB",
    "11.4.5-MariaDB-ubu2404", "8.4.3", "8.0.14", "9.1.0-commercial"])
def test_servers_that_hold_the_schema(version: str) -> None:
    assert unsupported_server(version) is None


@pytest.mark.parametrize(("version", "why"), [
    ("10.11.2-MariaDB", "MariaDB 10.11.2 is too old"),
    ("10.6.12-MariaDB-1:10.6.12+maria~ubu2004", "MDEV-30623"),
    ("10.5.23-MariaDB", "MariaDB 10.5.23 is too old"),
    ("10.7.8-MariaDB", "MariaDB 10.7.8 is too old"),
    ("8.0.13", "MySQL 8.0.13 is too old"),
    ("5.7.44-log", "MySQL 5.7.44 is too old"),
    ("unknown", "cannot tell the server's version"),
])
def test_servers_too_old_are_named_with_the_reason(version: str, why: str) -> None:
    refused = unsupported_server(version)
    assert refused is not None and why in refused


def test_the_server_here_holds_the_schema(migrated_db: DatabaseSettings) -> None:
    engine = sa.create_engine(migrated_db.url())
    try:
        with engine.connect() as conn:
            version = str(conn.exec_driver_sql("SELECT VERSION()").scalar())
    finally:
        engine.dispose()
    assert unsupported_server(version) is None, version
