"""Where job specs and container logs are stored: local directories (the default) or GCS.

One place chooses the backend (STYLE habit 6), from these variables:

| variable | default | meaning |
|---|---|---|
| ``HS_STORAGE_URL`` | unset: local dirs | ``gs://bucket/prefix``: in GCS (:mod:`.gcs`) |
| ``HS_GCS_ENDPOINT`` | Google's | the GCS API endpoint (an emulator: anonymous) |
| ``HS_GCS_SPOOL_DIR`` | the temp directory | where a log is spooled until its container ends |
| ``HS_GCP_PROJECT`` | the credentials' | the project of the storage client |

Without ``HS_STORAGE_URL`` the stores are exactly the local ones (``HS_SPEC_DIR``, ``HS_LOG_DIR``
and the worker's ``HS_WORKER_SPEC_DIR`` / ``HS_WORKER_LOG_DIR`` as before). The GCS client is
imported only when a ``gs://`` URL is configured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from services.common.specstore import LocalSpecStore, SpecStore
from services.worker.logstore import LocalLogStore, LogStore

if TYPE_CHECKING:
    from google.cloud.storage import Bucket


class StorageSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Which storage backend, and how to reach it."""

    url: str | None = None
    gcs_endpoint: str | None = None
    gcs_project: str | None = None
    spool_dir: str | None = None

    @property
    def is_local(self) -> bool:
        return not self.url


_ENV = {
    "HS_STORAGE_URL": "url",
    "HS_GCS_ENDPOINT": "gcs_endpoint",
    "HS_GCP_PROJECT": "gcs_project",
    "HS_GCS_SPOOL_DIR": "spool_dir",
}


def load_storage_settings(env: Mapping[str, str] | None = None) -> StorageSettings:
    """The storage settings from ``env`` (default: the process environment).

    Raises:
        ValueError: for an ``HS_STORAGE_URL`` that is not ``gs://bucket[/prefix]``.
    """
    env = os.environ if env is None else env
    settings = StorageSettings(**{field: env[var] for var, field in _ENV.items() if env.get(var)})
    if settings.url is not None:
        from services.common.gcs import parse_gs_url

        try:
            parse_gs_url(settings.url)
        except ValueError as e:
            raise ValueError(f"HS_STORAGE_URL: {e}; expected gs://bucket/prefix or nothing "
                             "(local directories)") from None
    return settings


def storage_env(settings: StorageSettings) -> dict[str, str]:
    """The variables that make another process (a worker on a VM) use the same storage."""
    return {var: value for var, field in _ENV.items()
            if var != "HS_GCS_SPOOL_DIR" and (value := getattr(settings, field))}


def open_spec_store(local_root: str | os.PathLike[str],
                    settings: StorageSettings | None = None) -> SpecStore:
    """The spec store: GCS when ``HS_STORAGE_URL`` says so, else files under ``local_root``."""
    settings = load_storage_settings() if settings is None else settings
    if settings.url is None:
        return LocalSpecStore(local_root)
    from services.common.gcs import GcsSpecStore

    bucket, prefix = _bucket(settings)
    return GcsSpecStore(bucket, prefix)


def open_log_store(local_root: str | os.PathLike[str],
                   settings: StorageSettings | None = None) -> LogStore:
    """The log store: GCS when ``HS_STORAGE_URL`` says so, else files under ``local_root``."""
    settings = load_storage_settings() if settings is None else settings
    if settings.url is None:
        return LocalLogStore(local_root)
    from services.common.gcs import GcsLogStore

    bucket, prefix = _bucket(settings)
    return GcsLogStore(bucket, prefix, spool_dir=settings.spool_dir)


def _bucket(settings: StorageSettings) -> tuple[Bucket, str]:
    from services.common.gcs import gcs_client, parse_gs_url

    assert settings.url is not None
    name, prefix = parse_gs_url(settings.url)
    client = gcs_client(endpoint=settings.gcs_endpoint, project=settings.gcs_project)
    return client.bucket(name), prefix
