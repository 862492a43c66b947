"""Job specs and container logs in Google Cloud Storage, behind the local stores' Protocols.

Selected by ``HS_STORAGE_URL=gs://bucket/prefix`` (see :mod:`services.common.storage`). Objects:

| object | what |
|---|---|
| ``{prefix}/specs/{batch_id}/{first_job_id}.specs`` | a bunch: the bytes of a local bunch file |
| ``{prefix}/logs/{batch_id}/{job_id}/{attempt_id}/{container}.log`` | one container's log |

An object appears whole or not at all (GCS uploads are atomic), so a bunch needs no temporary
name. Reading a job bisects the batch's sorted first job ids, as the local store does: one
listing per batch (cached, listed again when a job is not found in it) and a cache of decoded
bunches.

Logs are spooled: a :class:`GcsLogWriter` writes to a local file and uploads it when closed, so
ingest sees a container's log once the container ended. The worker that runs the container reads
the spool file until then (:meth:`GcsLogStore.read` in that process). A failed upload is logged,
not raised: the worker closes logs while it finishes an attempt, and a lost log must not lose the
attempt's completion.

Every call blocks (callers use ``asyncio.to_thread``). Errors of the client library are raised as
:class:`OSError`, the error the :class:`~services.common.specstore.SpecStore` Protocol promises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from services.common.specstore import _SUFFIX, BunchedSpecs
from services.worker.logstore import valid_name

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"^(\d+)" + re.escape(_SUFFIX) + "$")
# Overwriting a bunch or a log with the same bytes is idempotent: retry uploads, but not for
# longer than a client would wait for its submission.
_RETRY = DEFAULT_RETRY.with_timeout(30.0)
_TIMEOUT_S = 30.0

T = TypeVar("T")


def parse_gs_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``gs://bucket/prefix`` (prefix without slashes at either end)."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url!r}")
    bucket, _, prefix = url[len("gs://"):].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    return bucket, prefix.strip("/")


def gcs_client(*, endpoint: str | None = None, project: str | None = None) -> storage.Client:
    """A storage client: anonymous against ``endpoint`` (an emulator), else default credentials."""
    if endpoint:
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
        return storage.Client(project=project or "hailstream", credentials=credentials,
                              client_options=ClientOptions(api_endpoint=endpoint))
    return storage.Client(project=project)


def _call(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, with the client library's errors raised as OSError."""
    try:
        return fn()
    except (api_exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError) as e:
        raise OSError(f"GCS {what}: {type(e).__name__}: {e}") from e


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


class GcsSpecStore(BunchedSpecs):
    """Specs as objects under ``gs://{bucket}/{prefix}/specs/`` (a :class:`SpecStore`).

    Safe to call from several threads.
    """

    def __init__(self, bucket: storage.Bucket, prefix: str = "", *, cache_bunches: int = 64,
                 cache_batches: int = 1024) -> None:
        super().__init__(cache_bunches=cache_bunches, cache_batches=cache_batches)
        self.bucket = bucket
        self.prefix = _join(prefix.strip("/"), "specs")

    def directory(self, batch_id: int) -> str:
        """The prefix of the batch's bunches (ends with a slash)."""
        return f"{self.prefix}/{int(batch_id)}/"

    def object_name(self, batch_id: int, first_job_id: int) -> str:
        """The object of the bunch that starts at ``first_job_id``."""
        return f"{self.directory(batch_id)}{int(first_job_id)}{_SUFFIX}"

    def _store(self, batch_id: int, first_job_id: int, data: bytes) -> None:
        blob = self.bucket.blob(self.object_name(batch_id, first_job_id))
        _call("write", lambda: blob.upload_from_string(
            data, content_type="application/octet-stream", retry=_RETRY, timeout=_TIMEOUT_S))
        self._written(batch_id, first_job_id)

    def _list_ids(self, batch_id: int) -> list[int]:
        directory = self.directory(batch_id)
        names = _call("list", lambda: [b.name for b in self.bucket.client.list_blobs(
            self.bucket, prefix=directory, timeout=_TIMEOUT_S)])
        return [int(m.group(1)) for n in names if (m := _NUMBER.match(n[len(directory):]))]

    def _fetch(self, batch_id: int, first_job_id: int) -> bytes | None:
        return _download(self.bucket.blob(self.object_name(batch_id, first_job_id)))


def _download(blob: storage.Blob) -> bytes | None:
    """The object's bytes, or None when there is no such object."""
    def get() -> bytes | None:
        try:
            return bytes(blob.download_as_bytes(timeout=_TIMEOUT_S))
        except api_exceptions.NotFound:
            return None

    return _call("read", get)


LogKey = tuple[int, int, str, str]


class GcsLogWriter:
    """A container's log spooled to a local file and uploaded when closed (idempotent)."""

    def __init__(self, store: GcsLogStore, key: LogKey, spool: Path) -> None:
        self._store = store
        self._key = key
        self.spool = spool
        self._file = open(spool, "wb", buffering=0)  # noqa: SIM115 - closed by close()
        self._closed = False

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def fileno(self) -> int:
        """The spool's descriptor: a local process writes its output there directly."""
        return self._file.fileno()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._file.close()
        try:
            self._store.upload(self._key, self.spool)
        except OSError as e:  # never fail the attempt over its log (module docstring)
            log.error("uploading the log %s failed, it is lost: %s", self._key, e)
        finally:
            self._store.finished(self._key, self)
            with contextlib.suppress(FileNotFoundError):
                self.spool.unlink()

    def __enter__(self) -> GcsLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GcsLogStore:
    """Container logs as objects under ``gs://{bucket}/{prefix}/logs/`` (a :class:`LogStore`).

    Writers spool to ``spool_dir`` (default: the system's temporary directory).
    """

    def __init__(self, bucket: storage.Bucket, prefix: str = "", *,
                 spool_dir: str | os.PathLike[str] | None = None) -> None:
        self.bucket = bucket
        self.prefix = _join(prefix.strip("/"), "logs")
        self._spool_dir = Path(spool_dir or tempfile.gettempdir()) / "hs-gcs-logs"
        self._lock = threading.Lock()
        self._open: dict[LogKey, GcsLogWriter] = {}

    def object_name(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> str:
        """The object of one container's log."""
        for what, name in (("attempt id", attempt_id), ("container name", container)):
            if not valid_name(name):
                raise ValueError(f"invalid {what} {name!r}")
        return f"{self.prefix}/{int(batch_id)}/{int(job_id)}/{attempt_id}/{container}.log"

    def writer(self, batch_id: int, job_id: int, attempt_id: str, container: str
               ) -> GcsLogWriter:
        key = (int(batch_id), int(job_id), attempt_id, container)
        self.object_name(*key)  # validates the names
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self._spool_dir, prefix=f"{batch_id}-{job_id}-",
                                    suffix=f"-{container}.log")
        os.close(fd)
        writer = GcsLogWriter(self, key, Path(name))
        with self._lock:
            previous = self._open.get(key)
            self._open[key] = writer
        if previous is not None:  # a fresh log replaces one being written
            previous.close()
        return writer

    def read(self, batch_id: int, job_id: int, attempt_id: str, container: str) -> bytes | None:
        key = (int(batch_id), int(job_id), attempt_id, container)
        name = self.object_name(*key)
        with self._lock:
            writer = self._open.get(key)
        if writer is not None:  # being written by this process: the spool has it so far
            with contextlib.suppress(FileNotFoundError):
                return writer.spool.read_bytes()
        return _download(self.bucket.blob(name))

    def upload(self, key: LogKey, path: Path) -> None:
        """Upload the spool file ``path`` as the log ``key``; OSError when it failed."""
        blob = self.bucket.blob(self.object_name(*key))
        _call("upload", lambda: blob.upload_from_filename(
            str(path), content_type="text/plain", retry=_RETRY, timeout=_TIMEOUT_S))

    def finished(self, key: LogKey, writer: GcsLogWriter) -> None:
        """``writer`` is closed: reads of ``key`` go to the bucket."""
        with self._lock:
            if self._open.get(key) is writer:
                del self._open[key]

    def object_names(self) -> Iterator[str]:
        """Every log object (for tests and audits)."""
        yield from (b.name for b in self.bucket.client.list_blobs(self.bucket,
                                                                    prefix=self.prefix + "/"))
