"""Applies row operations on one connection, batching runs of the same shape into one statement.

Inserts and upserts of the same table and columns become one multi-row statement unless another
kind of write to the same table comes between them. Increments are
merged by key and written together whenever the writer flushes: before the handler reads state,
and at the end of the batch. Other updates and deletes run in order.

Updates of one row of ``jobs`` or ``attempts`` by primary key (what execution events do, several
times per job) are *deferred*: merged per row (later values win) and written at the end of the
flush, rows with the same columns together in one ``UPDATE ... JOIN (SELECT ... UNION ALL ...)``
statement. That is the same result as running them in order, because an operation emitted later
that could touch one of those rows (an insert of its key, an ``UpdateIn`` naming it, any delete
of the table) first turns the deferred updates of its table back into ordinary ones, in order.

Multi-row statements carry their values as literals, escaped by the connection exactly as
PyMySQL escapes parameters (:class:`Literals`): PyMySQL's own parameter path dispatches every
value through several calls, which was most of the projector's CPU for a bunch of jobs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from operator import add, itemgetter
from typing import Any, cast

import sqlalchemy as sa
from pymysql.constants import SERVER_STATUS

from core.projection.billing import Accruals, Billed
from core.projection.execution import JobFacts, Moves
from core.projection.ops import (
    Delete,
    Increment,
    Increments,
    InsertIgnore,
    Op,
    Row,
    Update,
    UpdateIn,
    Upsert,
    Value,
)
from schemas.base import JobState

IN_CHUNK = 5_000
BULK_CHUNK = 500
DEFERRED_KEYS: dict[str, tuple[str, ...]] = {
    "jobs": ("batch_id", "job_id"),
    "attempts": ("batch_id", "job_id", "attempt_id"),
}
"""Tables whose single-row updates by primary key are deferred and merged (see above)."""


def _key_getter(keys: tuple[str, ...]) -> Callable[[Row], tuple[Value, ...]]:
    """A row's values of ``keys``, as a tuple (KeyError if the row lacks one)."""
    if len(keys) > 1:
        return cast(Callable[[Row], tuple[Value, ...]], itemgetter(*keys))
    (key,) = keys

    def one(row: Row) -> tuple[Value, ...]:
        return (row[key],)
    return one


_KEY_OF = {table: _key_getter(keys) for table, keys in DEFERRED_KEYS.items()}
"""A row's primary key in the order of ``DEFERRED_KEYS``."""
COLUMN_DEFAULTS: dict[str, dict[str, Value]] = {
    "jobs": {"state": "Pending", "n_pending_parents": 0, "always_run": False,
             "n_max_attempts": 20, "memory_bytes": 0, "storage_gib": 0, "machine_type": None,
             "preemptible": True, "regions": None},
}
"""Column defaults of the tables' DDL (sql/), for the columns the projector inserts. A column
whose value is its default in every row of a multi-row INSERT is left out of it: MariaDB parses
and converts every literal of every row, and a bunch's job rows have seven such columns of
sixteen (server CPU of inserting 200k job rows: 2.4-3.0 s with them, 2.0-2.3 s without,
measured). tests/integration/test_writer_deferred.py checks these against the live schema."""
MAX_STATEMENT = 1_000_000
"""Characters of one multi-row statement (under any server's max_allowed_packet)."""
_NO_PARAMETERS = {"no_parameters": True}
_MEMO = 100_000
"""Distinct literals :meth:`Literals.rows` remembers per call."""
_SMALL_IN = 16
"""An ``UpdateIn`` of at most this many primary keys is deferred as that many row updates; a
bigger one (a commit's) stays one ``IN`` statement."""


def _q(name: str) -> str:
    return f"`{name}`"


def _cols(columns: Iterable[str]) -> str:
    return ", ".join(_q(c) for c in columns)


def _p(name: str) -> str:
    """A named placeholder in the driver's own style (PyMySQL: pyformat)."""
    return f"%({name})s"


def _values(columns: Sequence[str]) -> str:
    return ", ".join(_p(c) for c in columns)


class Literals:
    """SQL literals of values, as the DB-API connection ``raw`` escapes them (``escape``:
    PyMySQL's own, which honours the server's NO_BACKSLASH_ESCAPES for strings).

    Ints, None and bools take a short path giving exactly what ``escape`` gives them.
    """

    def __init__(self, raw: Any) -> None:
        self._escape: Callable[[object], str] = raw.escape
        self._raw = raw
        # PyMySQL's escape() of a str quotes what its _escape_string gives (it reads the
        # session's NO_BACKSLASH_ESCAPES at each call): :meth:`_quote` does the same faster.
        self._quotes = getattr(raw, "_escape_string", None) is not None and isinstance(
            getattr(raw, "server_status", None), int)

    def _quote(self, v: str) -> str:
        """What PyMySQL's ``_escape_string`` gives ``v``, read the same way from the session."""
        if self._raw.server_status & _NO_BACKSLASH_ESCAPES:
            return _doubled(v)
        return escape_text(v)

    @classmethod
    def of(cls, conn: sa.Connection) -> Literals | None:
        """For ``conn``'s driver connection, if it escapes like PyMySQL; else None."""
        raw = conn.connection.dbapi_connection
        return cls(raw) if callable(getattr(raw, "escape", None)) else None

    def __call__(self, value: object) -> str:
        t = type(value)
        if t is int:
            return str(value)
        if value is None:
            return "NULL"
        if t is bool:
            return "1" if value else "0"
        return self._escape(value)

    def rows(self, columns: Sequence[str], rows: Iterable[Row]) -> Iterator[str]:
        """``(v1, v2, ...)`` per row, the values of ``columns`` in order."""
        for lits in self.each(value_tuples(columns, rows)):
            yield "(" + ", ".join(lits) + ")"

    def rows_shared(self, columns: Sequence[str], rows: Sequence[Row],
                    defaults: Mapping[str, Value] | None = None
                    ) -> tuple[tuple[str, ...], Iterator[str]]:
        """Like :meth:`rows`, with the columns whose value is the same in every row rendered
        once and put last: the columns in their new order, and the rows. Of those, a column
        whose value is its entry in ``defaults`` (the table's own default) is left out.

        A bunch's job rows share 15 of their 17 values (batch, update, group, state,
        resources, pool...): rendering only the others halved the cost of its literals
        (measured, 1,024 rows). The others are rendered a column at a time
        (:meth:`column`), from the lists that told them apart."""
        n = len(rows)
        if n < 2:
            return tuple(columns), self.rows(columns, rows)
        varying: list[str] = []
        texts: list[list[str]] = []
        shared: list[str] = []
        for c in columns:
            values = list(map(itemgetter(c), rows))
            if values.count(values[0]) == n:
                shared.append(c)
            else:
                varying.append(c)
                texts.append(self.column(values))
        first = rows[0]
        if defaults and shared:
            shared = [c for c in shared if not _is_default(first[c], defaults, c)]
        end = ")"
        if shared:
            (literals,) = self.each([[first[c] for c in shared]])
            end = ", ".join(literals) + ")"
            if not varying:
                return tuple(shared), repeat("(" + end, n)
            end = ", " + end
        body = texts[0] if len(texts) == 1 else map(", ".join, zip(*texts, strict=True))
        return (*varying, *shared), map(add, map(add, repeat("(", n), body), repeat(end, n))

    def column(self, values: Sequence[object]) -> list[str]:
        """The literals of one column's values, as :meth:`each` renders them.

        A column of ints (or bools) is ``int.__repr__`` of each. A column of texts is each
        text quoted: as it is when none of them holds a character to escape (looked for once,
        in all of them joined), else escaped as :meth:`_quote` does it. Anything else goes
        value by value through :meth:`each`.

        Rendered a value at a time, a bunch's two varying job columns (id and name) were a
        fifth of the projector's CPU through a 1M-job submit (py-spy, 2026-11-30): 1.26 ms a
        bunch of 1,024 for all its rows' literals, 0.53 so. An execution flush's merged
        updates (ids, times, states, status documents) took 1.43 ms for 500 rows, 0.79 so.
        """
        kinds = set(map(type, values))
        if kinds <= _INT_KINDS:
            return list(map(_INT_TEXT, cast(Sequence[int], values)))
        if kinds == _STR_KIND and self._quotes:
            texts = cast(Sequence[str], values)
            joined = "".join(texts)
            if not any(char in joined for char in _QUOTED_SPECIAL):
                return list(map(add, map(add, repeat("'", len(texts)), texts),
                                repeat("'", len(texts))))
            quote = _doubled if self._raw.server_status & _NO_BACKSLASH_ESCAPES else escape_text
            return ["'" + quote(v) + "'" for v in texts]
        return [text for (text,) in self.each((v,) for v in values)]

    def each(self, tuples: Iterable[Iterable[object]]) -> Iterator[list[str]]:
        """The literals of each tuple of values, as :meth:`__call__` gives them (remembered
        per value: see :func:`rendered`)."""
        return rendered(tuples, self._render, {None: "NULL", True: "1", False: "0"})

    def _render(self, v: object) -> str:
        t = type(v)
        if t is int:
            return str(v)
        if t is str and self._quotes:
            return "'" + self._quote(cast(str, v)) + "'"
        return self._escape(v)


_NO_BACKSLASH_ESCAPES = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
_INT_KINDS = frozenset({int, bool})
_STR_KIND = frozenset({str})
_INT_TEXT = int.__repr__  # a bool's 1 or 0, as :meth:`Literals.__call__` renders it

_BACKSLASHED = (("\0", "\\0"), ("\n", "\\n"), ("\r", "\\r"), ("\x1a", "\\Z"),
                ('"', '\\"'), ("'", "\\'"))
_QUOTED_SPECIAL = ("\\", *(char for char, _ in _BACKSLASHED))
"""Every character a quoted text may need escaped, in either of the server's modes."""


def _doubled(v: str) -> str:
    """``v`` for a quoted literal when the session has NO_BACKSLASH_ESCAPES."""
    return v.replace("'", "''")


def escape_text(v: str) -> str:
    """``v`` escaped for a quoted MySQL string literal as PyMySQL's ``escape_string`` does it
    (backslash escapes), without its per-character ``str.translate``: each special character
    is looked for with ``in`` and replaced only when there. The projector escapes every status
    document (a few hundred characters per job) this way; translate was 6.6% of its time."""
    if "\\" in v:
        v = v.replace("\\", "\\\\")  # first: the others add backslashes
    for char, escaped in _BACKSLASHED:
        if char in v:
            v = v.replace(char, escaped)
    return v


def value_tuples(columns: Sequence[str], rows: Iterable[Row]) -> Iterator[tuple[object, ...]]:
    """The values of ``columns`` of each row, in order (one C call per row)."""
    if not columns:
        raise ValueError("a row of no columns has no values")
    pick = itemgetter(*columns)  # a tuple of the values, or the value of a single column
    return map(pick, rows) if len(columns) > 1 else ((pick(row),) for row in rows)


def _is_default(value: Value, defaults: Mapping[str, Value], column: str) -> bool:
    """Whether ``value`` is ``column``'s default: equal and of the same kind (a bool and an
    int stand for the same TINYINT, so they count as one kind; None only for None)."""
    if column not in defaults:
        return False
    default = defaults[column]
    if value is None or default is None:
        return value is None and default is None
    return value == default and isinstance(value, str) == isinstance(default, str)


def rendered(tuples: Iterable[Iterable[object]], render: Callable[[object], str],
             memo: dict[object, str]) -> Iterator[list[str]]:
    """``render`` of each value of each tuple, remembered per value for the call in ``memo``
    (which may come with values already in it).

    Rows repeat most of their values (states, pools, resources, flags): rendering each value
    anew was a third of a bulk rebuild's time (measured). Values equal in Python share a
    rendering (``True`` and ``1``): a renderer must render such values alike."""
    get = memo.get
    for values in tuples:
        out = []
        for v in values:
            text = get(v)
            if text is None:
                text = render(v)
                if len(memo) < _MEMO:
                    memo[v] = text
            out.append(text)
        yield out


class Skipped(Exception):
    """A pipeline's statement not run because one before it failed."""


class Pipeline:
    """Runs one writer's statements on a thread of its own, in order.

    PyMySQL waits for the server without the GIL, so while MariaDB executes a job bunch's rows
    the caller folds the next events: the projector's Python and the database's work overlap
    instead of taking turns. The connection is the caller's, used by one
    thread at a time: the caller touches it only after :meth:`wait` (before any read, and
    before storing offsets and committing). After a statement fails, the rest are skipped, and
    the failure is raised by the next :meth:`wait`.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._futures: list[Future[None]] = []
        self._failed = False

    def submit(self, fn: Callable[[], object]) -> Future[None]:
        """Run ``fn`` after everything submitted before it; its future fails if ``fn`` raised
        or was skipped (:class:`Skipped`) after an earlier failure."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projector-sql")
        future = self._executor.submit(self._run, fn)
        self._futures.append(future)
        return future

    def _run(self, fn: Callable[[], object]) -> None:
        if self._failed:
            raise Skipped("an earlier statement of the pipeline failed")
        try:
            fn()
        except BaseException:
            self._failed = True
            raise

    def wait(self) -> None:
        """Wait for every statement submitted; raise the first failure."""
        futures, self._futures = self._futures, []
        first: BaseException | None = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # the first one is raised below
                first = first or e
        self._failed = False
        if first is not None:
            raise first

    def settled(self, future: Future[None]) -> None:
        """Wait for ``future`` (one this pipeline returned) and raise its failure; once it
        succeeded, so did everything submitted before it, which :meth:`wait` then skips."""
        try:
            future.result()
        except Skipped:
            before = self._futures[:self._futures.index(future)] if (
                future in self._futures) else []
            for f in before:  # raise what made it skip
                e = f.exception()
                if e is not None and not isinstance(e, Skipped):
                    raise e from None
            raise
        if future in self._futures:  # else a wait() took it already
            del self._futures[:self._futures.index(future) + 1]

    def drain(self) -> None:
        """Wait for every statement submitted, whatever happened (before a rollback)."""
        with contextlib.suppress(BaseException):
            self.wait()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


class Writer:
    """Buffers operations and applies them on ``conn`` (inside the caller's transaction);
    ``flush(wait=False)`` hands the statements to ``pipeline`` when given."""

    def __init__(self, conn: sa.Connection, pipeline: Pipeline | None = None) -> None:
        self._conn = conn
        self._pipeline = pipeline
        self._handing_over = False
        self._literals = Literals.of(conn)
        self._pending: list[Op] = []
        self._increments = Increments()
        # Billed intervals and job movements, summed; into _increments at each flush.
        self._accruals = Accruals()
        self._moves = Moves()
        self._deferred: dict[str, dict[tuple[Value, ...], dict[str, Value]]] = {}
        self.statements = 0

    def emit(self, ops: Iterable[Op]) -> None:
        for op in ops:
            if isinstance(op, Increment):
                self._increments.add(op)
                continue
            keys = DEFERRED_KEYS.get(op.table)
            if keys is not None:
                if isinstance(op, Update) and len(op.where) == len(keys) and all(
                        k in op.where for k in keys):
                    row = tuple(op.where[k] for k in keys)
                    self._deferred.setdefault(op.table, {}).setdefault(row, {}).update(op.values)
                    continue
                if (isinstance(op, UpdateIn) and len(op.values_in) <= _SMALL_IN
                        and len(op.where) + 1 == len(keys)
                        and set(op.where) | {op.column} == set(keys)):
                    # A few rows by primary key (children released by one job's end): the
                    # same as that many single-row updates, so they merge like those.
                    deferred = self._deferred.setdefault(op.table, {})
                    for i in op.values_in:
                        row = tuple(i if k == op.column else op.where[k] for k in keys)
                        deferred.setdefault(row, {}).update(op.values)
                    continue
                if self._touches_deferred(op, keys):
                    self._undefer(op.table)
            self._pending.append(op)

    def update_row(self, table: str, key: tuple[Value, ...], values: Mapping[str, Value]
                   ) -> None:
        """Set ``values`` of one row of a table in ``DEFERRED_KEYS`` by its primary key (in
        that order): ``emit([Update(table, values, dict(zip(keys, key)))])`` without the op.

        The projector's handlers set a few columns of a job and its attempt per execution
        event; the op and emit's checks of it cost more than the merge itself.
        """
        deferred = self._deferred.get(table)
        if deferred is None:
            deferred = self._deferred[table] = {}
        row = deferred.get(key)
        if row is None:
            deferred[key] = dict(values)
        else:
            row.update(values)

    def accrue(self, who: Billed, quantities: Mapping[str, int], from_ms: int, to_ms: int,
               token: int) -> None:
        """Bill an interval into the rollups: ``emit(accrue(...))`` without the ops."""
        self._accruals.add(who, quantities, from_ms, to_ms, token)

    def move(self, job: JobFacts, old: JobState, new: JobState, ancestors: Sequence[int],
             token: int) -> None:
        """A job's counter movements: ``emit(move(...))`` without the ops."""
        self._moves.add(job, old, new, ancestors, token)

    def _touches_deferred(self, op: Op, keys: tuple[str, ...]) -> bool:
        deferred = self._deferred.get(op.table)
        if not deferred:
            return False
        match op:
            case InsertIgnore(rows=rows) | Upsert(rows=rows):
                # In C: the projector inserts an attempt's row per SJ, and a bunch's 1,024 job
                # rows while earlier jobs' updates are deferred.
                try:
                    return not deferred.keys().isdisjoint(map(_KEY_OF[op.table], rows))
                except KeyError:  # a row without every key column: compare as None
                    return any(tuple(r.get(k) for k in keys) in deferred for r in rows)
            case UpdateIn(where=where, column=column, values_in=ids) if (
                    set(where) | {column} == set(keys)):
                return any(tuple(where[k] if k != column else i for k in keys) in deferred
                           for i in ids)
            case _:
                return True

    def _undefer(self, table: str) -> None:
        """Turn the deferred updates of ``table`` back into ordinary ones, in order."""
        keys = DEFERRED_KEYS[table]
        for row, values in self._deferred.pop(table, {}).items():
            self._pending.append(Update(table, values, dict(zip(keys, row, strict=True))))

    def flush(self, *, wait: bool = True) -> None:
        """Apply everything buffered. Call before reading state the buffered ops may change.

        With a pipeline and ``wait=False``, the statements are handed to it and may still be
        running on return: nothing may use the connection before a flush (or :meth:`sync`)
        that waits. A flush that waits runs its own statements here, after those handed over
        (small statements, as execution events make, cost more to hand over than to send).
        """
        if wait or self._pipeline is None:
            self.sync()
            self._flush()
            return
        self._handing_over = True
        try:
            self._flush()
        finally:
            self._handing_over = False

    def sync(self) -> None:
        """Wait until every statement submitted ran (raising the first failure)."""
        if self._pipeline is not None:
            self._pipeline.wait()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if self._deferred:
            pending = self._into_inserts(pending)
        # Open runs of inserts/upserts by shape. Tables have no foreign keys, so writes to
        # different tables commute: only a write of another shape to the same table closes a run.
        runs: dict[tuple[object, ...], list[InsertIgnore | Upsert]] = {}
        for op in pending:
            shape = _shape(op) if isinstance(op, InsertIgnore | Upsert) else None
            for other in [k for k in runs if k[0] == op.table and k != shape]:
                self._write_run(runs.pop(other))
            if isinstance(op, InsertIgnore | Upsert):
                if op.rows:
                    runs.setdefault(_shape(op), []).append(op)
            else:
                self._write(op)
        for run in runs.values():
            self._write_run(run)
        # Increments of one table and key columns go in one statement whatever columns they
        # move: a column a row does not move is added 0 (counter columns default to 0).
        by_table: dict[tuple[str, tuple[str, ...]], list[Increment]] = {}
        self._accruals.drain_into(self._increments)
        self._moves.drain_into(self._increments)
        for inc in self._increments.drain():
            by_table.setdefault((inc.table, tuple(inc.key)), []).append(inc)
        for (table, keys), incs in by_table.items():
            deltas = tuple(dict.fromkeys(c for inc in incs for c in inc.deltas))
            rows = [{**inc.key, **{d: inc.deltas.get(d, 0) for d in deltas}} for inc in incs]
            cols = keys + deltas
            sets = ", ".join(f"{_q(d)} = {_q(d)} + VALUES({_q(d)})" for d in deltas)
            self._insert(table, cols, rows, f"ON DUPLICATE KEY UPDATE {sets}", keep=deltas)
        deferred, self._deferred = self._deferred, {}
        for table, updates in deferred.items():
            by_columns: dict[tuple[str, ...], list[tuple[tuple[Value, ...], Row]]] = {}
            for row, values in updates.items():
                by_columns.setdefault(tuple(values), []).append((row, values))
            for columns, rows_ in by_columns.items():
                self._bulk_update(table, DEFERRED_KEYS[table], columns, rows_)

    def _into_inserts(self, pending: list[Op]) -> list[Op]:
        """``pending`` with the deferred updates of rows it inserts folded into those inserts.

        An SJ inserts an attempt's row and its MJC, often in the same transaction, updates it:
        one ``INSERT ... ON DUPLICATE KEY UPDATE`` of the updated columns is the same as the
        insert (ignoring a row that exists) followed by the update, and MariaDB writes the row
        once instead of twice. Only for a table whose pending writes are all plain inserts:
        a deferred update was held back past every insert of its row (an insert of a deferred
        row undefers it), and nothing else pending may touch the row in between. Inserts of
        one table with different keys commute, so the merged rows go after the others.
        """
        tables = {op.table for op in pending
                  if isinstance(op, InsertIgnore) and op.table in self._deferred}
        if not tables:
            return pending
        tables -= {op.table for op in pending if not isinstance(op, InsertIgnore)}
        if not tables:
            return pending
        out: list[Op] = []
        merged: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[Row]] = {}
        for op in pending:
            if not isinstance(op, InsertIgnore) or op.table not in tables:
                out.append(op)
                continue
            deferred, key_of = self._deferred[op.table], _KEY_OF[op.table]
            plain: list[Row] = []
            for row in op.rows:
                try:
                    values = deferred.pop(key_of(row), None)
                except KeyError:  # a row without every key column
                    values = None
                if values is None:
                    plain.append(row)
                    continue
                update = tuple(sorted(values))
                row = {**{c: v for c, v in row.items() if c not in values},
                       **{c: values[c] for c in update}}
                merged.setdefault((op.table, tuple(row), update), []).append(row)
            if len(plain) == len(op.rows):
                out.append(op)
            elif plain:
                out.append(InsertIgnore(op.table, plain))
        out += [Upsert(table, rows, update) for (table, _, update), rows in merged.items()]
        return out

    def _bulk_update(self, table: str, keys: tuple[str, ...], columns: tuple[str, ...],
                     rows: Sequence[tuple[tuple[Value, ...], Row]]) -> None:
        """Set ``columns`` of many rows, each to its own values, in few statements."""
        if len(rows) == 1:
            row, values = rows[0]
            self._write(Update(table, values, dict(zip(keys, row, strict=True))))
            return
        names = keys + columns
        on = " AND ".join(f"t.{_q(k)} = u.{_q(k)}" for k in keys)
        sets = ", ".join(f"t.{_q(c)} = u.{_q(c)}" for c in columns)
        lit = self._literals
        for start in range(0, len(rows), BULK_CHUNK):
            chunk = rows[start:start + BULK_CHUNK]
            if lit is not None:
                # A column at a time (Literals.column): the keys, times and ids of an
                # execution flush's rows are columns of ints.
                texts = [lit.column(c) for c in zip(
                    *[(*row, *map(values.__getitem__, columns)) for row, values in chunk],
                    strict=True)]
                selects = ["SELECT " + ", ".join(
                    f"{t[0]} AS {_q(n)}" for n, t in zip(names, texts, strict=True))]
                selects += map(add, repeat("SELECT ", len(chunk) - 1),
                               map(", ".join, zip(*[t[1:] for t in texts], strict=True)))
                self._literal_sql(
                    f"UPDATE {_q(table)} AS t JOIN ({' UNION ALL '.join(selects)}) AS u "
                    f"ON {on} SET {sets}")
                self.statements += 1
                continue
            params: dict[str, Value] = {}
            selects = []
            for i, (row, values) in enumerate(chunk):
                items = [*row, *(values[c] for c in columns)]
                parts = []
                for n, (name, value) in enumerate(zip(names, items, strict=True)):
                    params[f"p{i}_{n}"] = value
                    parts.append(f"{_p(f'p{i}_{n}')} AS {_q(name)}" if i == 0
                                 else _p(f"p{i}_{n}"))
                selects.append("SELECT " + ", ".join(parts))
            self._exec(f"UPDATE {_q(table)} AS t JOIN ({' UNION ALL '.join(selects)}) AS u "
                       f"ON {on} SET {sets}", params)

    def _literal_sql(self, sql: str) -> None:
        """Run a statement whose values are all literals, with no parameters at all
        (``no_parameters``: the driver gets ``cursor.execute(sql)``), so nothing reads ``%`` in
        the values as a placeholder. Through SQLAlchemy, not a raw cursor: its errors must be
        SQLAlchemy's, which callers classify (a deadlock or a lost server is retried; a raw
        driver error escaped every retry and stopped the replay, seen in CI)."""
        if self._handing_over and self._pipeline is not None:
            self._pipeline.submit(functools.partial(
                self._conn.exec_driver_sql, sql, execution_options=_NO_PARAMETERS))
            return
        self._conn.exec_driver_sql(sql, execution_options=_NO_PARAMETERS)

    def _exec(self, sql: str, params: Sequence[Row] | Row) -> None:
        # Straight to the driver: these statements are built here, with placeholders in the
        # driver's style, so SQLAlchemy's text parsing and caching would only add time.
        self._send(sql, [dict(p) for p in params] if isinstance(params, Sequence)
                   else dict(params))
        self.statements += 1

    def _send(self, sql: str, args: list[dict[str, Any]] | dict[str, Any]) -> None:
        if self._handing_over and self._pipeline is not None:
            self._pipeline.submit(functools.partial(self._conn.exec_driver_sql, sql, args))
        else:
            self._conn.exec_driver_sql(sql, args)

    def _write_run(self, run: Sequence[InsertIgnore | Upsert]) -> None:
        if not run:
            return
        rows = [row for op in run for row in op.rows]
        if not rows:
            return
        first = run[0]
        cols = tuple(rows[0])
        if isinstance(first, Upsert):
            sets = ", ".join(f"{_q(c)} = VALUES({_q(c)})" for c in first.update)
        else:  # a no-op update ignores duplicates only (INSERT IGNORE would hide other errors)
            sets = f"{_q(cols[0])} = {_q(cols[0])}"
        self._insert(first.table, cols, rows, f"ON DUPLICATE KEY UPDATE {sets}",
                     keep=first.update if isinstance(first, Upsert) else cols[:1])

    def _insert(self, table: str, columns: Sequence[str], rows: Sequence[Row], tail: str,
                keep: Sequence[str] = ()) -> None:
        """``INSERT INTO table (columns) VALUES ... tail``: as few statements as fit; columns
        at their default in every row are left out, but for those ``keep`` names (the
        tail's)."""
        if self._literals is None:
            head = f"INSERT INTO {_q(table)} ({_cols(columns)}) VALUES "
            self._exec(f"{head}({_values(columns)}) {tail}", rows)
            return
        defaults = COLUMN_DEFAULTS.get(table)
        if defaults and keep:
            defaults = {c: v for c, v in defaults.items() if c not in keep}
        columns, parts = self._literals.rows_shared(columns, rows, defaults)
        head = f"INSERT INTO {_q(table)} ({_cols(columns)}) VALUES "
        self._statements(head, parts, ", ", f" {tail}")

    def _statements(self, head: str, parts: Iterable[str], sep: str, tail: str) -> None:
        """``head part sep part ... tail``, split into statements of at most MAX_STATEMENT
        characters (a part longer than that alone still makes one statement).

        Parts that fit in one statement (a bunch's rows do) are joined at once: the loop
        below, a step per part, was about 7% of the projector's CPU through the 1M submit."""
        parts = list(parts)
        if not parts:
            return
        if len(head) + len(tail) + sum(map(len, parts)) + len(sep) * len(parts) \
                <= MAX_STATEMENT:
            self._literal_sql(head + sep.join(parts) + tail)
            self.statements += 1
            return
        chunk: list[str] = []
        size = len(head) + len(tail)
        for part in parts:
            if chunk and size + len(sep) + len(part) > MAX_STATEMENT:
                self._literal_sql(head + sep.join(chunk) + tail)
                self.statements += 1
                chunk, size = [], len(head) + len(tail)
            chunk.append(part)
            size += len(sep) + len(part)
        if chunk:
            self._literal_sql(head + sep.join(chunk) + tail)
            self.statements += 1

    def _write(self, op: Op) -> None:
        match op:
            case Update(table=table, values=values, where=where):
                sets = ", ".join(f"{_q(c)} = {_p(f'v_{c}')}" for c in values)
                conds = " AND ".join(f"{_q(c)} = {_p(f'w_{c}')}" for c in where)
                self._exec(f"UPDATE {_q(table)} SET {sets} WHERE {conds}",
                           {**{f"v_{k}": v for k, v in values.items()},
                            **{f"w_{k}": v for k, v in where.items()}})
            case UpdateIn(table=table, values=values, where=where, column=column,
                          values_in=ids):
                sets = ", ".join(f"{_q(c)} = {_p(f'v_{c}')}" for c in values)
                conds = " AND ".join(f"{_q(c)} = {_p(f'w_{c}')}" for c in where)
                params: dict[str, object] = {**{f"v_{k}": v for k, v in values.items()},
                                             **{f"w_{k}": v for k, v in where.items()}}
                sql = (f"UPDATE {_q(table)} SET {sets} WHERE {conds} "
                       f"AND {_q(column)} IN {_p('ids')}")  # a tuple expands to (a, b, ...)
                for i in range(0, len(ids), IN_CHUNK):
                    self._send(sql, {**params, "ids": tuple(ids[i:i + IN_CHUNK])})
                    self.statements += 1
            case Delete(table=table, where=where):
                conds = " AND ".join(f"{_q(c)} = {_p(c)}" for c in where)
                self._exec(f"DELETE FROM {_q(table)} WHERE {conds}", where)
            case _:
                raise TypeError(f"unexpected operation {op!r}")


def _shape(op: InsertIgnore | Upsert) -> tuple[object, ...]:
    """Ops of one shape become one multi-row statement (the table comes first)."""
    columns = tuple(op.rows[0]) if op.rows else ()
    return (op.table, type(op).__name__, columns,
            op.update if isinstance(op, Upsert) else ())
