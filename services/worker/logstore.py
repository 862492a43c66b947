"""Where a worker keeps the container logs of its attempts.

A log is named by (batch_id, job_id, attempt_id, container), ``container`` being the task
(``input``, ``main``, ``output``). :class:`LocalLogStore` keeps them as files under a root
directory, ``{root}/{batch_id}/{job_id}/{attempt_id}/{container}.log``, written unbuffered so a
reader sees a running job's output. A cloud backend (GCS) plugs in behind :class:`LogStore`: it
writes to a local file and uploads it when the writer is closed; the worker calls ``close`` and
``read`` in a thread, so both may block.
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

    def directory(self, batch_id: int, job_id: int, attempt_id: str) -> Path:
        """The attempt's directory (not created)."""
        if not valid_name(attempt_id):
            raise ValueError(f"invalid attempt id {attempt_id!r}")
        return self.root / str(int(batch_id)) / str(int(job_id)) / attempt_id

    def path(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> Path:
        """The file of one container's log."""
        if not valid_name(container):
            raise ValueError(f"invalid container name {container!r}")
        return self.directory(batch_id, job_id, attempt_id) / f"{container}.log"

    def writer(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> FileLogSink:
        if not valid_name(container):
            raise ValueError(f"invalid container name {container!r}")
        return FileLogSink(self.directory(batch_id, job_id, attempt_id), container)

    def read(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> bytes | None:
        try:
            return self.path(batch_id, job_id, attempt_id, container).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
