"""Apply the forward-only SQL migrations of the projection schema (``sql/NNN-description.sql``).

``apply_migrations(db)`` creates the database if it is missing, records every applied file in
``schema_migrations`` (version, file name, sha256, time) and applies the files not yet applied,
in version order, under a server-wide named lock so that concurrent runners never both apply.

Forward-only: a file that was applied must never change or disappear (:class:`MigrationError`
otherwise); a fix is a new file with a higher number. A new file numbered below one already
applied is refused too, so the order of the files is the order they ran everywhere.

Every file is read and split before the server is touched, so a misnamed, duplicated or
unterminated file changes nothing. MySQL DDL is not transactional, so each file is recorded
right after its last statement succeeds; a file that fails half-way is not recorded and must be
repaired by hand. Migrations use plain ``CREATE TABLE`` (never ``IF NOT EXISTS``) so that a
rerun of a half-applied file fails loudly instead of silently skipping.

The statement splitter is deliberately simple, because all logic lives in Python and no stored
procedures or triggers are needed:

- a statement ends with ``;`` as the last character of a line (trailing spaces allowed);
- lines whose first non-blank characters are ``--`` are comments and are dropped;
- so ``;`` must not end a line inside a string literal, no comment may follow the final ``;``,
  ``DELIMITER`` and ``#`` / ``/* */`` comments are not supported.

CLI: ``python -m sql.migrate`` applies pending migrations to the database named by the ``HS_DB_*``
environment (``services.common.settings``); ``--status`` lists applied and pending files.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from services.common.settings import DatabaseSettings, load_settings

MIGRATIONS_DIR = Path(__file__).resolve().parent
LOCK_TIMEOUT_S = 60
# utf8mb4_bin: identifiers, tokens and attribute values compare byte for byte (Hail's `k=v` and
# the unique (user, token) are exact), and it behaves the same on MariaDB and MySQL 8, whose
# default collations differ (utf8mb4_general_ci vs utf8mb4_0900_ai_ci, the latter unknown to
# MariaDB 10.11). A database created beforehand with another default is switched to it.
CHARSET = "utf8mb4"
COLLATION = "utf8mb4_bin"

_FILE_RE = re.compile(r"^(\d{3,})-([a-z0-9][a-z0-9_-]*)\.sql$")
_NO_PARAMS = {"no_parameters": True}  # hand SQL to the driver verbatim (no %-interpolation)
_CREATE_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
  version INT NOT NULL PRIMARY KEY,
  name VARCHAR(255) NOT NULL,
  checksum CHAR(64) NOT NULL,
  applied_at DATETIME(3) NOT NULL
) ENGINE=InnoDB
"""


class MigrationError(Exception):
    """The migrations on disk and the ones applied to the database disagree, or one failed."""


@dataclass(frozen=True)
class Migration:
    """One migration file: ``version`` from its ``NNN-`` prefix, ``checksum`` its sha256."""

    version: int
    name: str
    checksum: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class MigrationStatus:
    """A migration on disk and when it was applied (``None``: pending)."""

    version: int
    name: str
    applied_at: datetime | None


def split_statements(text: str) -> list[str]:
    """Split SQL text into statements: ``;`` at end of line ends one; ``--`` lines are dropped."""
    statements: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        current.append(line.rstrip())
        if stripped.endswith(";"):
            statement = "\n".join(current)[:-1].strip()
            if statement:
                statements.append(statement)
            current = []
    if current:
        raise MigrationError(f"unterminated statement (no ';' at end of line): {current[0]!r}")
    return statements


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in ``directory`` in version order; misnamed or duplicate is an error."""
    by_version: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None or int(match.group(1)) == 0:
            raise MigrationError(f"{path}: migration files are named NNN-description.sql, NNN > 0")
        version = int(match.group(1))
        if version in by_version:
            raise MigrationError(
                f"duplicate migration version {version}: {by_version[version].name} and {path.name}"
            )
        data = path.read_bytes()
        try:  # split every file up front: a bad file fails before the server is touched
            statements = tuple(split_statements(data.decode("utf-8")))
        except (MigrationError, UnicodeDecodeError) as e:
            raise MigrationError(f"{path.name}: {e}") from None
        by_version[version] = Migration(
            version, path.name, hashlib.sha256(data).hexdigest(), statements
        )
    return [by_version[v] for v in sorted(by_version)]


def _pending(
    migrations: Sequence[Migration], applied: dict[int, tuple[str, str]]
) -> list[Migration]:
    """Check applied migrations against the files and return the files still to apply."""
    on_disk = {m.version: m for m in migrations}
    for version, (name, checksum) in sorted(applied.items()):
        migration = on_disk.get(version)
        if migration is None:
            raise MigrationError(
                f"migration {version} ({name}) is applied in the database but its file is gone; "
                "migrations are forward-only: restore the file"
            )
        if migration.checksum != checksum:
            raise MigrationError(
                f"{migration.name} changed after it was applied (sha256 {checksum[:12]}… in the "
                f"database, {migration.checksum[:12]}… on disk); migrations are forward-only: "
                "restore the file and add a new migration instead"
            )
    pending = [m for m in migrations if m.version not in applied]
    if pending and applied and pending[0].version < max(applied):
        raise MigrationError(
            f"{pending[0].name} is pending but migration {max(applied)} is already applied; "
            f"renumber it above {max(applied)}"
        )
    return pending


def _quote(name: str) -> str:
    if "`" in name or not name:
        raise MigrationError(f"bad database name {name!r}")
    return f"`{name}`"


# Where a MariaDB series got the fix of MDEV-30623 (a JSON_TABLE in a scalar subquery taken as
# uncorrelated: one row's result reused for every row), which the per-job cost reads rely on.
_MARIADB_JSON_TABLE_FIXED: dict[tuple[int, int], int] = {
    (10, 6): 13, (10, 7): 999, (10, 8): 8, (10, 9): 6, (10, 10): 4, (10, 11): 3, (11, 0): 2}
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def unsupported_server(version: str) -> str | None:
    """Why a server reporting ``version`` (``SELECT VERSION()``) cannot hold this schema, or
    None. The reads need ``JSON_TABLE`` with outer references: MySQL 8.0.14 and later,
    MariaDB 10.6.13, 10.11.3, 11.0.2 and later in their series (MDEV-30623)."""
    match = _VERSION.match(version)
    if match is None:
        return f"cannot tell the server's version from {version!r}"
    major, minor, patch = map(int, match.groups())
    if "mariadb" in version.lower():
        fixed = _MARIADB_JSON_TABLE_FIXED.get((major, minor), 0)
        if (major, minor) < (10, 6) or patch < fixed:
            return (f"MariaDB {major}.{minor}.{patch} is too old: this schema's reads need "
                    "JSON_TABLE in correlated subqueries (MariaDB 10.6.13, 10.11.3, 11.0.2 or "
                    "later in their series; MDEV-30623)")
        return None
    if (major, minor, patch) < (8, 0, 14):
        return (f"MySQL {major}.{minor}.{patch} is too old: this schema's reads need "
                "JSON_TABLE with outer references (MySQL 8.0.14 or later)")
    return None


@contextlib.contextmanager
def _server(db: DatabaseSettings) -> Iterator[sa.Connection]:
    """One autocommit connection to the server (no database selected); disposed afterwards."""
    engine = sa.create_engine(
        db.url(database=False), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


@contextlib.contextmanager
def _migration_lock(conn: sa.Connection, database: str) -> Iterator[None]:
    """Hold the server-wide named lock ``<database>.migrations`` (session-scoped)."""
    name = f"{database}.migrations"[:64]  # MySQL 8 limits lock names to 64 characters
    got = conn.execute(sa.text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": LOCK_TIMEOUT_S})
    if got.scalar() != 1:
        raise MigrationError(f"could not take lock {name!r} within {LOCK_TIMEOUT_S} s")
    try:
        yield
    finally:
        # A broken connection has released the lock already; don't mask the original error.
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.execute(sa.text("SELECT RELEASE_LOCK(:n)"), {"n": name})


def _read_applied(conn: sa.Connection) -> dict[int, tuple[str, str]]:
    rows = conn.execute(sa.text("SELECT version, name, checksum FROM schema_migrations"))
    return {int(r.version): (str(r.name), str(r.checksum)) for r in rows}


def _ensure_database(conn: sa.Connection, database: str) -> None:
    quoted = _quote(database)
    conn.exec_driver_sql(
        f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET {CHARSET} COLLATE {COLLATION}",
        execution_options=_NO_PARAMS,
    )
    collation = conn.execute(
        sa.text("SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA "
                "WHERE SCHEMA_NAME = :d"), {"d": database}
    ).scalar()
    if collation != COLLATION:  # created beforehand (e.g. by an operator): new tables use ours
        conn.exec_driver_sql(
            f"ALTER DATABASE {quoted} CHARACTER SET {CHARSET} COLLATE {COLLATION}",
            execution_options=_NO_PARAMS,
        )
    conn.exec_driver_sql(f"USE {quoted}", execution_options=_NO_PARAMS)
    conn.exec_driver_sql(_CREATE_SCHEMA_MIGRATIONS, execution_options=_NO_PARAMS)


def _apply(conn: sa.Connection, migration: Migration) -> None:
    statements = migration.statements
    for i, statement in enumerate(statements, 1):
        try:
            conn.exec_driver_sql(statement, execution_options=_NO_PARAMS)
        except sa.exc.DBAPIError as e:
            raise MigrationError(
                f"{migration.name}: statement {i} of {len(statements)} failed: {e.orig}\n"
                f"{statement}\n"
                "Statements before it took effect (MySQL DDL is not transactional) and the file "
                "is not recorded: undo them by hand, fix the file, and run again."
            ) from e
    conn.execute(
        sa.text("INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                "VALUES (:v, :n, :c, UTC_TIMESTAMP(3))"),
        {"v": migration.version, "n": migration.name, "c": migration.checksum},
    )


def apply_migrations(db: DatabaseSettings, directory: Path | None = None) -> list[int]:
    """Create ``db.name`` if missing and apply every pending migration, in version order.

    Args:
        db: where the database lives; ``db.name`` is created if it does not exist.
        directory: the migration files (default: this package's directory).

    Returns:
        The versions applied by this call; empty when the database was up to date.

    Raises:
        MigrationError: the server is too old (:func:`unsupported_server`), a file is misnamed
            or duplicated, an applied file changed or vanished, a statement failed, or the
            lock could not be taken in time.
    """
    migrations = discover(directory or MIGRATIONS_DIR)
    with _server(db) as conn, _migration_lock(conn, db.name):
        refused = unsupported_server(str(conn.exec_driver_sql("SELECT VERSION()").scalar()))
        if refused is not None:
            raise MigrationError(refused)
        _ensure_database(conn, db.name)
        pending = _pending(migrations, _read_applied(conn))
        for migration in pending:
            _apply(conn, migration)
        return [m.version for m in pending]


def migration_status(db: DatabaseSettings, directory: Path | None = None) -> list[MigrationStatus]:
    """Every migration on disk with the time it was applied; checks applied ones like apply."""
    migrations = discover(directory or MIGRATIONS_DIR)
    applied: dict[int, tuple[str, str]] = {}
    applied_at: dict[int, datetime] = {}
    with _server(db) as conn:
        exists = conn.execute(
            sa.text("SELECT COUNT(*) FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = :d AND TABLE_NAME = 'schema_migrations'"),
            {"d": db.name},
        ).scalar()
        if exists:
            table = f"{_quote(db.name)}.schema_migrations"
            rows = conn.execute(sa.text(f"SELECT version, name, checksum, applied_at FROM {table}"))
            for r in rows:
                applied[int(r.version)] = (str(r.name), str(r.checksum))
                applied_at[int(r.version)] = r.applied_at
    _pending(migrations, applied)
    return [MigrationStatus(m.version, m.name, applied_at.get(m.version)) for m in migrations]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sql.migrate [--status]``."""
    parser = argparse.ArgumentParser(
        prog="python -m sql.migrate", description="Apply the projection schema's migrations."
    )
    parser.add_argument("--status", action="store_true", help="list applied and pending migrations")
    parser.add_argument("--directory", type=Path, default=MIGRATIONS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    db = load_settings().db
    try:
        if args.status:
            for s in migration_status(db, args.directory):
                when = f"applied {s.applied_at:%Y-%m-%d %H:%M:%S}Z" if s.applied_at else "pending"
                print(f"{s.version:>4}  {s.name:<45} {when}")
            return 0
        applied = apply_migrations(db, args.directory)
    except MigrationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    where = f"{db.host}:{db.port}/{db.name}"
    print(f"applied {applied} to {where}" if applied else f"{where} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
