"""Where job specs live, so a job can be run by its id alone.

Ingest writes the specs of every ``JobsSubmitted`` bunch here *before* it publishes the event;
a worker handed a job without its spec reads it back by (batch_id, job_id). The event still
carries the specs, so a replay of the log never needs this store.

:class:`LocalSpecStore` keeps one file per bunch, ``{root}/{batch_id}/{first_job_id}.specs``,
holding the bunch's job ids and spec texts as msgpack, compressed with zstd (a bunch of 1,024
no-op specs is 269 KB of msgpack and 6 KB compressed; files written before compression are
plain msgpack, and still read), or ingest's bunches: the request's JSON array as it came,
compressed, its jobs numbered from the file's first job id. A file appears whole or not at all:
it is written to a temporary name in the same directory, flushed to disk, then renamed over its
final name, and the directory is flushed too (the rename itself is only on disk once it is). A cloud
backend (GCS) plugs in behind :class:`SpecStore`; callers run its blocking methods in a thread
(``asyncio.to_thread``).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import cramjam
import msgspec

_FILE = re.compile(r"^(\d+)\.specs$")
_SUFFIX = ".specs"


class SpecStore(Protocol):
    """Job specs by (batch_id, job_id), written a bunch at a time."""

    def write_bunch(self, batch_id: int, specs: Sequence[tuple[int, str]]) -> None:
        """Store one bunch: ``(job_id, spec JSON text)`` pairs, job ids increasing.

        Writing a bunch again (a retried request) replaces it. Raises OSError when the bunch
        could not be stored; nothing is then visible to readers.
        """
        ...

    def write_run(self, batch_id: int, first_job_id: int, specs: Sequence[str]) -> None:
        """:meth:`write_bunch` of the job ids ``first_job_id``, ``first_job_id + 1``, ...: a
        bunch as ingest has it, without a pair made and checked per job."""
        ...

    def write_json(self, batch_id: int, first_job_id: int, specs: bytes) -> None:
        """:meth:`write_run` of the elements of ``specs``, a JSON array of the bunch's specs
        (the request's body as ingest received it, checked): stored as it is."""
        ...

    def read(self, batch_id: int, job_id: int) -> str | None:
        """The spec JSON text of the job, or None when the store has none."""
        ...

    def cached(self, batch_id: int, job_id: int) -> str | None:
        """The spec if this process has it in memory (no I/O, safe on an event loop), else
        None, which says nothing about the store: :meth:`read` finds out."""
        ...


class _Bunch(msgspec.Struct, frozen=True, array_like=True):
    """One file: the job ids of a bunch (increasing) and their specs, in the same order."""

    job_ids: list[int]
    specs: list[str]

    def find(self, job_id: int) -> str | None:
        i = bisect.bisect_left(self.job_ids, job_id)
        if i < len(self.job_ids) and self.job_ids[i] == job_id:
            return self.specs[i]
        return None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Bunch)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
"""How a zstd frame begins; a plain bunch begins with a msgpack array's header (0x92)."""
_LEVEL = 1
"""zstd's fastest level. Specs of one bunch repeat each other: level 3 compresses them only 5%
smaller, for about half again the time."""


def encode_bunch(job_ids: list[int], specs: list[str]) -> bytes:
    """A bunch's stored bytes: its msgpack, compressed.

    Compressed, the write copies some 40 times fewer bytes into the page cache and the disk:
    copying the 269 KB of a bunch of 1,024 no-op specs into the file was about a sixth of
    ingest's CPU through the 1M submit (perf, 2026-11-30), compressing it costs about 0.1 ms.
    """
    raw = _encoder.encode(_Bunch(job_ids=job_ids, specs=specs))
    return bytes(cramjam.zstd.compress(raw, level=_LEVEL))


def encode_json_bunch(specs: bytes) -> bytes:
    """A bunch's stored bytes from its specs as one JSON array: the array, compressed.

    The job ids are the file's: its first job id and those after it. Stored as it came, the
    body is never cut into strings nor encoded again on the request path (its elements are
    cut apart once by the reader that needs them, a worker, and cached).
    """
    if specs[:1] != b"[":  # JSON's whitespace before the array: the reader looks for "["
        specs = specs.lstrip()
    return bytes(cramjam.zstd.compress(specs, level=_LEVEL))


def decode_bunch(data: bytes, first_job_id: int | None = None) -> _Bunch:
    """A bunch from its stored bytes: compressed (:func:`encode_bunch`,
    :func:`encode_json_bunch`) or plain msgpack. A JSON array's jobs are numbered from
    ``first_job_id`` (the bunch's file).

    Raises:
        msgspec.DecodeError: The bytes are not a bunch (or not a whole zstd frame of one).

    """
    if data[:4] == _ZSTD_MAGIC:
        try:
            data = bytes(cramjam.zstd.decompress(data))
        except cramjam.DecompressionError as e:
            raise msgspec.DecodeError(f"a stored bunch that does not decompress: {e}") from e
    if data[:1] == b"[":  # a msgpack bunch begins with an array header (0x92)
        if first_job_id is None:
            raise msgspec.DecodeError("a bunch of JSON specs read without its first job id")
        specs = [str(raw, "utf-8") for raw in _json_array.decode(data)]
        return _Bunch(job_ids=list(range(first_job_id, first_job_id + len(specs))),
                      specs=specs)
    return _decoder.decode(data)


_json_array = msgspec.json.Decoder(list[msgspec.Raw])


class BunchedSpecs:
    """What both stores share: reading a job through a cached, sorted listing of a batch's
    bunches (their first job ids) and a cache of decoded bunches. Subclasses list a batch
    (:meth:`_list_ids`) and fetch one bunch's bytes (:meth:`_fetch`). Safe to call from
    several threads."""

    def __init__(self, *, cache_bunches: int, cache_batches: int) -> None:
        self._cache_bunches = cache_bunches
        self._cache_batches = cache_batches
        self._lock = threading.Lock()
        self._listings: OrderedDict[int, list[int]] = OrderedDict()
        self._bunches: OrderedDict[tuple[int, int], _Bunch] = OrderedDict()

    def write_bunch(self, batch_id: int, specs: Sequence[tuple[int, str]]) -> None:
        if not specs:
            return
        job_ids = [int(j) for j, _ in specs]
        if any(a >= b for a, b in itertools.pairwise(job_ids)):
            raise ValueError(f"the job ids of a bunch must increase: {job_ids[:10]}...")
        self._store(batch_id, job_ids[0], encode_bunch(job_ids, [s for _, s in specs]))

    def write_run(self, batch_id: int, first_job_id: int, specs: Sequence[str]) -> None:
        # The pairs and their check cost 0.15 ms a bunch of 1,024, this 0.03 (timeit).
        if not specs:
            return
        first = int(first_job_id)
        self._store(batch_id, first, encode_bunch(list(range(first, first + len(specs))),
                                                  list(specs)))

    def write_json(self, batch_id: int, first_job_id: int, specs: bytes) -> None:
        self._store(batch_id, int(first_job_id), encode_json_bunch(specs))

    def _store(self, batch_id: int, first_job_id: int, data: bytes) -> None:
        """Store one bunch's bytes, whole or not at all, then :meth:`_written` (I/O)."""
        raise NotImplementedError

    def _list_ids(self, batch_id: int) -> list[int]:
        """The first job ids of the batch's stored bunches, in any order (I/O)."""
        raise NotImplementedError

    def _fetch(self, batch_id: int, first_job_id: int) -> bytes | None:
        """The stored bytes of one bunch, or None if it is not there (I/O)."""
        raise NotImplementedError

    def _written(self, batch_id: int, first_job_id: int) -> None:
        """A bunch was (re)written by this process: its readers see it at once."""
        with self._lock:
            self._bunches.pop((batch_id, first_job_id), None)
            listing = self._listings.get(batch_id)
            if listing is not None and first_job_id not in listing:
                bisect.insort(listing, first_job_id)

    def cached(self, batch_id: int, job_id: int) -> str | None:
        """The spec if its bunch is in this process's memory, else None; never does I/O.

        None does not mean the job has no spec: :meth:`read` then finds out.
        """
        with self._lock:
            listing = self._listings.get(batch_id)
            if listing is None:
                return None
            i = bisect.bisect_right(listing, job_id) - 1
            bunch = self._bunches.get((batch_id, listing[i])) if i >= 0 else None
        return None if bunch is None else bunch.find(job_id)

    def read(self, batch_id: int, job_id: int) -> str | None:
        """The spec JSON text of the job, or None when the store has none."""
        with self._lock:
            cached = self._listings.get(batch_id)
            if cached is not None:
                self._listings.move_to_end(batch_id)
                cached = list(cached)
        if cached is not None:
            found, complete = self._find(batch_id, job_id, cached, fresh=False)
            if complete:
                return found
        # Not in the cached listing: list again (a newer bunch, or a bunch rewritten since
        # it was cached).
        return self._find(batch_id, job_id, self._list(batch_id), fresh=True)[0]

    def _find(self, batch_id: int, job_id: int, listing: list[int], *, fresh: bool
              ) -> tuple[str | None, bool]:
        """(spec, whether the answer is final) from the bunch ``listing`` points at."""
        i = bisect.bisect_right(listing, job_id) - 1
        if i < 0:
            return None, fresh
        bunch = self._bunch(batch_id, listing[i], cached=not fresh)
        if bunch is None:  # listed but gone (a deleted batch): list again
            return None, fresh
        found = bunch.find(job_id)
        return found, found is not None or fresh

    def _list(self, batch_id: int) -> list[int]:
        listing = sorted(self._list_ids(batch_id))
        with self._lock:
            if listing:
                self._listings[batch_id] = listing
                self._listings.move_to_end(batch_id)
                while len(self._listings) > self._cache_batches:
                    self._listings.popitem(last=False)
            else:
                self._listings.pop(batch_id, None)
        return listing

    def _bunch(self, batch_id: int, first_job_id: int, *, cached: bool) -> _Bunch | None:
        key = (batch_id, first_job_id)
        if cached:
            with self._lock:
                hit = self._bunches.get(key)
                if hit is not None:
                    self._bunches.move_to_end(key)
                    return hit
        data = self._fetch(batch_id, first_job_id)
        if data is None:
            return None
        bunch = decode_bunch(data, first_job_id)
        with self._lock:
            self._bunches[key] = bunch
            self._bunches.move_to_end(key)
            while len(self._bunches) > self._cache_bunches:
                self._bunches.popitem(last=False)
        return bunch


def fsync_directory(path: Path) -> None:
    """Flush a directory's entries (names made, renamed or removed) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalSpecStore(BunchedSpecs):
    """Specs as files under ``root`` (the local default, and tests').

    Reading a job bisects the batch directory's sorted first job ids (listed once per batch, and
    listed again when a job is not found in the cached listing: a newer bunch may have arrived)
    and keeps the last ``cache_bunches`` decoded bunches. Safe to call from several threads.
    """

    def __init__(self, root: str | os.PathLike[str], *, cache_bunches: int = 64,
                 cache_batches: int = 1024, fsync: bool = True) -> None:
        super().__init__(cache_bunches=cache_bunches, cache_batches=cache_batches)
        self.root = Path(root)
        # Flush before the rename, so a crash of the machine (not only of the process) never
        # leaves an empty file under the final name once the event is published.
        self._fsync = fsync

    def directory(self, batch_id: int) -> Path:
        """The batch's directory (not created)."""
        return self.root / str(int(batch_id))

    def path(self, batch_id: int, first_job_id: int) -> Path:
        """The file of the bunch that starts at ``first_job_id``."""
        return self.directory(batch_id) / f"{int(first_job_id)}{_SUFFIX}"

    def _store(self, batch_id: int, first_job_id: int, data: bytes) -> None:
        directory = self.directory(batch_id)
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
        except FileNotFoundError:  # the batch's first bunch: only then make its directory
            # (a mkdir of an existing directory per bunch waited on the directory's lock
            # behind the other bunches' renames: a tenth of a bunch request's time, measured)
            directory.mkdir(parents=True, exist_ok=True)
            if self._fsync:  # the batch's directory is an entry of the root's
                fsync_directory(directory.parent)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self._fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.path(batch_id, first_job_id))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        if self._fsync:
            # The new name is an entry of the directory: until the directory is on disk, a
            # crash of the machine could lose it, and the bunch's event is published next.
            fsync_directory(directory)
        self._written(batch_id, first_job_id)

    def _list_ids(self, batch_id: int) -> list[int]:
        try:
            names = os.listdir(self.directory(batch_id))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        return [int(m.group(1)) for n in names if (m := _FILE.match(n))]

    def _fetch(self, batch_id: int, first_job_id: int) -> bytes | None:
        try:
            return self.path(batch_id, first_job_id).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
