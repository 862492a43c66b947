"""Bulk rows into MySQL with ``LOAD DATA LOCAL INFILE``: the rebuild's cheapest write.

A folded batch's rows are new rows of tables keyed by the batch. MariaDB spends about 40% less
CPU loading them from a tab-separated file than parsing the same values out of multi-row
INSERT statements (measured on the replay bench's 91,000 events: 0.0133 vs 0.0217 ms of server
CPU per event), and the rebuild is bound by the machine's CPU.

Loading needs the driver's consent (PyMySQL's ``local_infile=True``, which
:data:`CONNECT_ARGS` gives the rebuild's own engines, and only them: the server may then ask
for any file the client can read) and the server's (``local_infile``, on in MariaDB by
default and off in MySQL 8). :func:`can_load` asks both once per connection; without either,
the caller writes the rows with the projector's writer as before.

``LOCAL`` makes the server turn what would be errors (a duplicate key, a value that does not
fit) into warnings, since it cannot stop the client mid-file. A load here is strict instead:
any warning, or fewer rows than were sent, raises :class:`LoadError` and the caller's
transaction rolls back. Only values with an exact text form are loaded (str, int, bool, None);
rows with any other value raise :class:`NotLoadable` and go through the writer.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from itertools import repeat
from operator import add, attrgetter, itemgetter
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from pymysql.constants import CLIENT

from core.billing import JobUsage, UsageFormat
from core.projection.ops import Row

CONNECT_ARGS: dict[str, Any] = {"local_infile": True}
"""PyMySQL's connect arguments that let a connection load local files."""

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})
# Tab-separated, backslash escapes, one line per row: the defaults, spelled out because under
# the sql_mode NO_BACKSLASH_ESCAPES the default escape is none. The tab and the newline are
# written as themselves, the backslash as that mode reads a string literal.
_STATEMENT = ("LOAD DATA LOCAL INFILE %s INTO TABLE `{table}` CHARACTER SET utf8mb4 "
              "FIELDS TERMINATED BY '\t' ENCLOSED BY '' ESCAPED BY '{backslash}' "
              "LINES TERMINATED BY '\n' ({columns})")


class LoadError(Exception):
    """A load that did not insert exactly the rows sent (the server's warnings say why)."""


class NotLoadable(TypeError):
    """Rows that cannot be loaded: a value without an exact text form, or no space for the
    file. Nothing was sent: insert them instead."""


def can_load(conn: sa.Connection) -> bool:
    """Whether ``conn`` may ``LOAD DATA LOCAL``: its driver connection allows local files
    and the server accepts them. Remembered on the connection's pool record."""
    info = conn.connection.info
    known = info.get("hs_can_load")
    if known is None:
        flags = getattr(conn.connection.dbapi_connection, "client_flag", 0)
        known = bool(flags & CLIENT.LOCAL_FILES) and bool(
            conn.exec_driver_sql("SELECT @@local_infile").scalar())
        info["hs_can_load"] = known
    return bool(known)


def text(value: object) -> str:
    """``value`` as a field of the load file (``\\N`` is NULL)."""
    if value is None:
        return "\\N"
    t = type(value)
    if t is bool:
        return "1" if value else "0"
    if t is int:
        return str(value)
    if t is str:
        return str(value).translate(_ESCAPES)
    raise TypeError(f"no load-file form for {t.__name__} values")


_SCALARS: dict[object, str] = {None: "\\N", True: "1", False: "0"}
# True == 1 and False == 0 as keys: the ints 1 and 0 look up "1" and "0", their own text.
_NUMBERS = frozenset({int, bool, type(None)})
_TEXTS = frozenset({str, type(None)})
_LOADABLE = _NUMBERS | _TEXTS
_SPECIAL = tuple(chr(c) for c in _ESCAPES)


def column(values: Sequence[object], kinds: set[type] | None = None) -> list[str]:
    """The load-file fields of one column's ``values``, as :func:`text` renders each.

    A whole column at a time, in C calls: a rebuild loads a million rows, and rendering value
    by value in Python was a quarter of a bulk lane's time (profiled). A column of ints, bools
    and NULLs is looked up and stringified; a column of texts and NULLs is escaped only when
    some text holds a character to escape. TypeError for a value :func:`text` has no form for
    (``kinds``: the values' types, when the caller has them).
    """
    if kinds is None:
        kinds = _kinds(values)
    if kinds <= _NUMBERS:
        if kinds == _INTS:
            return list(map(_INT_TEXT, cast(Sequence[int], values)))
        return list(map(str, map(_SCALARS.get, values, values)))
    if kinds <= _TEXTS:
        joined = "".join(filter(None, values))  # type: ignore[arg-type]  # texts only
        if not any(c in joined for c in _SPECIAL):
            if kinds == _STRS:
                return list(cast(Sequence[str], values))
            return list(map(_SCALARS.get, values, values))  # type: ignore[arg-type]
    return list(map(text, values))


_INTS = frozenset({int})
_STRS = frozenset({str})
_INT_TEXT = int.__repr__  # an int's digits, a bool's 1 or 0; TypeError for any other value


def _varying(values: Sequence[object]) -> list[str]:
    """:func:`column` of ``values``, in one pass for the usual column of ints or of texts.

    The values of a varying column are scattered objects (times, ids, statuses of 100,000
    rows): typing them first, then rendering them, went over each twice, about a fifth of the
    rendering (measured). A column of ints is rendered by ``int.__repr__``, which refuses any
    other value; one of texts is joined (which refuses any other) to look for characters to
    escape. Anything else, or a column where either refuses, goes through :func:`column`.
    (So here a subclass of int or of str in such a column loads as its value, where
    :func:`text` refuses it; the rows a fold makes hold none.)
    """
    kind = type(values[0])
    if kind is int:
        try:
            return list(map(_INT_TEXT, cast(Sequence[int], values)))
        except TypeError:
            pass
    elif kind is str:
        try:
            joined = "".join(cast(Sequence[str], values))
        except TypeError:
            pass
        else:
            if not any(c in joined for c in _SPECIAL):
                return list(cast(Sequence[str], values))
            return list(map(text, values))
    return column(values)


def _kinds(values: Sequence[object]) -> set[type]:
    kinds = set(map(type, values))
    if not kinds <= _LOADABLE:
        odd = min(k.__name__ for k in kinds - _LOADABLE)
        raise TypeError(f"no load-file form for {odd} values")
    return kinds


class Lines(NamedTuple):
    """A load file's lines and what the statement says beside them."""

    columns: list[str]
    """The columns each line holds, in order (a name starting with ``@`` is a variable of
    the statement's, read for a ``computed`` column)."""
    lines: list[str]
    """One per row: its values of ``columns``, tab-separated."""
    shared: list[tuple[str, object]]
    """The other columns, each with the value it has in every row: set once by the statement
    (``SET column = value``), not repeated on every line."""
    computed: tuple[tuple[str, str, tuple[object, ...]], ...] = ()
    """Columns the statement computes from a variable of the file, each as (column, SQL
    expression with ``%s`` placeholders, their values): ``SET column = expression``."""


_BIGINT_MAX = 2**63 - 1


def _usage_column(values: Sequence[object]) -> tuple[list[str], UsageFormat | None]:
    """A column of :class:`core.billing.JobUsage` and NULLs: its fields and, where every usage
    is of one format whose numbers fit MariaDB's BIGINT, that format.

    With the format, the fields are the usages' milliseconds (NULL stays NULL), and the
    statement renders each text (:func:`_usage_expression`): a job's usage text is 130 bytes
    here, 30% of MariaDB's CPU loading the replay bench's jobs, which parses a file byte by
    byte; the same texts rendered by MariaDB from the milliseconds cost it 30-40% less for
    the whole load (measured, texts identical). Without, the fields are the texts (of the
    usages, and of the column's other values). TypeError for a value without a text form.
    """
    whole = None not in values  # every job billed: the usual column, in C calls
    present = values if whole else [v for v in values if v is not None]
    if set(map(type, present)) == {JobUsage}:
        usages = cast(Sequence[JobUsage], present)
        formats = list(map(attrgetter("format"), usages))
        distinct = set(dict(zip(map(id, formats), formats, strict=True)).values())
        if len(distinct) == 1:
            (fmt,) = distinct
            ms = list(map(attrgetter("ms"), usages))
            if max(ms) * max(fmt.per_ms) <= _BIGINT_MAX:
                if whole:
                    return list(map(_INT_TEXT, ms)), fmt
                return column([None if v is None else cast(JobUsage, v).ms
                               for v in values]), fmt
    # Texts, where a usage is one (column refuses what has no text form).
    return column([v.text() if type(v) is JobUsage else v for v in values]), None


def _usage_field(name: str, values: Sequence[object], varying: list[tuple[str, list[str]]],
                 computed: list[tuple[str, str, tuple[object, ...]]]) -> None:
    """Column ``name`` of usages (:func:`_usage_column`) added to a file's fields, as
    milliseconds read into a variable and computed by the statement where it can be."""
    rendered, fmt = _usage_column(values)
    if fmt is None:
        varying.append((name, rendered))
    else:
        variable = f"@hs_{len(computed)}"
        varying.append((variable, rendered))
        computed.append((name, *_usage_expression(variable, fmt)))


def _usage_expression(variable: str, fmt: UsageFormat) -> tuple[str, tuple[object, ...]]:
    """SQL that renders ``fmt``'s text of the milliseconds in ``variable`` (NULL for NULL),
    with the values of its placeholders. The numbers are BIGINT products, written as
    Python writes them; the texts between them go as the driver quotes any string."""
    parts = ["%s"]
    params: list[object] = [fmt.pieces[0]]
    for q, piece in zip(fmt.per_ms, fmt.pieces[1:], strict=True):
        parts += [f"CAST({variable} AS SIGNED) * %s", "%s"]
        params += [q, piece]
    return f"CONCAT({', '.join(parts)})", tuple(params)


def lines(columns: Sequence[str], rows: Sequence[Row]) -> Lines:
    """The load file's lines of ``rows``; TypeError for a value :func:`text` has no form for.

    A column whose value is the same in every row (a batch's rows share most: batch, state,
    pool, resources...) is left out of the file and set by the statement instead. MariaDB
    then parses each such value once, not once a row: loading the replay bench's 100,000 jobs
    and 100,000 attempts cost it 9-21% less CPU (4 alternating pairs; in the replay bench,
    11% less of MariaDB's CPU, lower in 6 of 8 pairs), and the attempts' file no longer
    repeats their resources, 200 bytes a row. The first column always stays in the file, so
    that every line has a field; the others keep their order."""
    if not columns:
        raise ValueError("a row of no columns has no values")
    varying: list[tuple[str, list[str]]] = []
    shared: list[tuple[str, object]] = []
    computed: list[tuple[str, str, tuple[object, ...]]] = []
    n = len(rows)
    # Each row's values at once, then turned into columns: one pass over the rows. A pass
    # per column went over every row's dict again (a batch's rows are hundreds of MB at a
    # million jobs): 3x the time of this at 20,000 jobs rows of 26 columns (measured).
    if len(columns) == 1:
        by_column: list[Sequence[object]] = [list(map(itemgetter(columns[0]), rows))]
    else:
        by_column = list(zip(*map(itemgetter(*columns), rows), strict=True))
    for i, (c, values) in enumerate(zip(columns, by_column, strict=True)):
        first = values[0]
        if type(first) is JobUsage:
            _usage_field(c, values, varying, computed)
            continue
        try:
            # One kind, all equal: one value (equal values of one loadable kind load alike).
            # A column whose ends differ varies: it is rendered without a pass to count or
            # type it.
            if i and values[-1] == first and values.count(first) == n:
                kinds = _kinds(values)
                if len(kinds) == 1:
                    shared.append((c, first))
                    continue
                varying.append((c, column(values, kinds)))
            else:
                varying.append((c, _varying(values)))
        except TypeError:
            if not any(type(v) is JobUsage for v in values):
                raise
            _usage_field(c, values, varying, computed)
    fields = [f for _, f in varying]
    if len(fields) == 1:
        body = list(map(add, fields[0], repeat("\n")))
    else:
        body = list(map(add, map("\t".join, zip(*fields, strict=True)), repeat("\n")))
    return Lines([c for c, _ in varying], body, shared, tuple(computed))


def load(conn: sa.Connection, table: str, rows: Sequence[Row], *,
         scratch: str | None = None) -> None:
    """Insert ``rows`` (dicts with the same keys) into ``table`` on ``conn``, in the caller's
    transaction; :class:`LoadError` unless exactly they were inserted, without a warning,
    :class:`NotLoadable` (before anything is sent) for a value without a text form."""
    if not rows:
        return
    try:
        columns, body_lines, shared, computed = lines(list(rows[0]), rows)
        body = "".join(body_lines).encode()
    except TypeError as e:  # nothing was sent
        raise NotLoadable(f"rows of {table}: {e}") from None
    try:
        fd, path = tempfile.mkstemp(prefix=f"hs-load-{table}-", suffix=".tsv", dir=scratch)
    except OSError as e:  # no writable scratch space (a read-only /tmp): insert instead
        raise NotLoadable(f"no file for the rows of {table}: {e}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
        except OSError as e:  # a full disk: nothing was sent
            raise NotLoadable(f"no file for the rows of {table}: {e}") from None
        mode = str(conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar())
        sql = _STATEMENT.format(
            table=table, columns=", ".join(c if c[0] == "@" else f"`{c}`" for c in columns),
            backslash="\\" if "NO_BACKSLASH_ESCAPES" in mode else "\\\\")
        sets = [f"`{c}` = %s" for c, _ in shared] + [f"`{c}` = {e}" for c, e, _ in computed]
        if sets:  # the driver quotes the values, as it would an insert's
            sql += " SET " + ", ".join(sets)
        params = (path, *(v for _, v in shared), *(v for _, _, ps in computed for v in ps))
        inserted = conn.exec_driver_sql(sql, params).rowcount
        warnings = conn.exec_driver_sql("SHOW WARNINGS LIMIT 5").all()
    finally:
        os.unlink(path)
    if inserted != len(rows) or warnings:
        said = "; ".join(f"{w[0]} {w[1]}: {w[2]}" for w in warnings) or "no warning"
        raise LoadError(f"loading {len(rows)} rows into {table} inserted {inserted} ({said})")
