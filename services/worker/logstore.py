"""Where a worker keeps the container logs of its attempts.

A log is named by (batch_id, job_id, attempt_id, container), ``container`` being the task
(``input``, ``main``, ``output``). :class:`LocalLogStore` keeps them as files under a root
directory, ``{root}/{batch_id}/{job_id}+{attempt_id}+{container}.log``, written unbuffered so a
reader sees a running job's output. One directory per batch, not two more per attempt: making
them (with the attempt's working directory, through pathlib) cost a no-op job's worker 0.37 ms
of CPU, against 0.07 ms with this layout and plain ``os`` calls. ``+`` never occurs in a valid
name, so the file name is unambiguous. Logs written under the earlier layout
(``{root}/{batch_id}/{job_id}/{attempt_id}/{container}.log``) are still read.

A file is made on its log's first byte (:meth:`FileLogSink.lazy`; the process spawner makes it
for a job it runs): most short jobs write nothing, and creating a file was the largest single
cost of a no-op job's worker (an inode and a directory entry, 0.03 ms of the worker's 0.27 ms a
job, more while the file system still holds recently freed inodes). No file for a container
that ran reads as an empty log.

A cloud backend (GCS) plugs in behind :class:`LogStore`: it writes to a local file and uploads
it when the writer is closed; the worker calls ``close`` and ``read`` in a thread, so both may
block.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol

from services.worker.runtime import FileLogSink, LogSink

# Attempt ids and container names become path components: no separators, no dot-files.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def valid_name(name: str) -> bool:
    """Whether ``name`` is safe as an attempt id or container name (one path component)."""
    return bool(_NAME.match(name))


class LogWriter(LogSink, Protocol):
    """A container's log being written; closing it makes it durable in the store."""

    def close(self) -> None:
        """Finish the log (flush, upload)."""
        ...


class LogStore(Protocol):
    """Stores the container logs of attempts, by (batch, job, attempt, container)."""

    def writer(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> LogWriter:
        """A fresh (truncated) log for the container, open for writing."""
        ...

    def read(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> bytes | None:
        """The log's bytes so far, or None when there is no such log."""
        ...


class LocalLogStore:
    """Container logs as files under ``root`` (the local stack's default, and tests')."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._root = os.fspath(root)

    def directory(self, batch_id: int) -> Path:
        """The batch's directory (not created)."""
        return self.root / str(int(batch_id))

    def path(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> Path:
        """The file of one container's log."""
        _check(attempt_id, container)
        return self.directory(batch_id) / f"{int(job_id)}+{attempt_id}+{container}.log"

    def writer(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> FileLogSink:
        """The log, made (with the batch's directory) on its first byte: a container that
        writes nothing leaves no file, and reads as empty once its attempt has started."""
        # Strings, not pathlib: this runs once per job on the worker's event loop.
        _check(attempt_id, container)
        return FileLogSink.lazy(
            f"{self._root}/{int(batch_id)}/{int(job_id)}+{attempt_id}+{container}.log")

    def read(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> bytes | None:
        for path in (self.path(batch_id, job_id, attempt_id, container),
                     self.directory(batch_id) / str(int(job_id)) / attempt_id
                     / f"{container}.log"):  # the earlier layout
            try:
                return path.read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                continue
        return None


def _check(attempt_id: str, container: str) -> None:
    if not valid_name(attempt_id):
        raise ValueError(f"invalid attempt id {attempt_id!r}")
    if not valid_name(container):
        raise ValueError(f"invalid container name {container!r}")
