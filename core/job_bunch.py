"""A bunch of job specs straight from its JSON body: one typed decode, the checks' fallback.

:func:`core.job_specs.job_records` checks decoded JSON key by key in Python, about 5 us a job.
Most bunches hold only the keys the official client sends for ordinary jobs, with values of the
expected types; msgspec checks those in C while decoding into :class:`_Spec`. A bunch that
decodes that way gives its records here (only values the typed decode cannot check are looked
at again); any other bunch, valid or not, goes through ``job_records`` unchanged, so what is
accepted and every error message stay those of the checks. The typed schema is stricter than
the checks, never looser: tests/core/test_job_bunch.py compares the two on generated bunches.

A record's spec text is the client's own JSON for that job (a slice of the body); ingest asks
for none and keeps the body whole instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

from core.job_specs import DEFAULT_N_MAX_ATTEMPTS, job_records, records_of
from core.resources import InstCollConfig
from core.specs import MAX_BUNCH_SIZE
from schemas.batch import JobRecord


# gc=False: these structs are trees of values decoded from a body (no cycles), so the cyclic
# collector need not track the thousands a bunch makes (see schemas/base.py). Arrays decode as
# tuples: an empty one is CPython's shared empty tuple (the client sends two empty parent lists
# a job) and any other is one object where a list is two, so a bunch of 1,024 makes and frees
# some 3,000 fewer objects (job_records_json 0.87 -> 0.78 ms a bunch, timeit at probe 14).
class _Docker(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: Literal["docker"]
    image: str
    command: tuple[str, ...]
    mount_docker_socket: bool | None = None


class _EnvVar(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    name: str
    value: str


class _File(msgspec.Struct, forbid_unknown_fields=True, gc=False,
            rename={"source": "from"}):
    source: str
    to: str


class _Spec(msgspec.Struct, forbid_unknown_fields=True, gc=False,
            rename={"in_update_id": "job_id"}):
    """The keys of an ordinary job spec, a :class:`~core.job_specs.CheckedSpec` as decoded.

    A null counts as absent in the checks: here it fails the typed decode where the key has a
    default other than None (the checks then take the bunch, with the same outcome).
    """

    in_update_id: int
    process: _Docker
    always_run: bool = False
    always_copy_output: bool | None = None
    n_max_attempts: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_N_MAX_ATTEMPTS
    absolute_parent_ids: tuple[int, ...] | None = None
    in_update_parent_ids: tuple[int, ...] | None = None
    parent_ids: tuple[int, ...] | None = None
    absolute_job_group_id: int | None = None
    in_update_job_group_id: int | None = None
    attributes: dict[str, str] = {}
    resources: dict[str, Any] | None = None
    regions: list[str] | None = None
    env: tuple[_EnvVar, ...] | None = None
    input_files: tuple[_File, ...] | None = None
    output_files: tuple[_File, ...] | None = None

    @property
    def jvm(self) -> bool:
        return False  # a docker process: the only kind this schema takes


_SPECS = msgspec.json.Decoder(list[_Spec])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])


def _typed(data: bytes) -> list[_Spec] | None:
    """The specs of a bunch every spec of which is ordinary; else None."""
    try:
        specs = _SPECS.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if len(specs) > MAX_BUNCH_SIZE:
        return None
    for s in specs:
        if s.process.mount_docker_socket or (s.absolute_job_group_id is not None
                                             and s.in_update_job_group_id is not None):
            return None  # refused by the checks, with their message
    return specs


def _texts(data: bytes) -> list[str]:
    """Each element of a JSON array as its own text (the array decoded once already)."""
    return [str(raw, "utf-8") for raw in _RAWS.decode(data)]


def job_records_json(
    data: bytes,
    *,
    start_job_id: int,
    n_jobs: int,
    start_job_group_id: int,
    n_job_groups: int,
    config: InstCollConfig,
    known_group: Callable[[int], bool],
    is_developer: bool = False,
    batch_id: int | None = None,
    texts: bool = True,
) -> list[JobRecord]:
    """:func:`core.job_specs.job_records` of a JSON body (empty: no body).

    ``texts``: as ``job_records``. Without, the body, once accepted, is the jobs' specs as one
    text (:attr:`schemas.batch.JobsSubmitted.specs`), and nothing cuts it into a string a job.

    Raises:
        BadRequest: As ``job_records``.
        msgspec.DecodeError: The body is not JSON.

    """
    typed = _typed(data) if data else None
    if typed is not None:
        return records_of(typed, _texts(data) if texts else None, start_job_id=start_job_id,
                          n_jobs=n_jobs, start_job_group_id=start_job_group_id,
                          n_job_groups=n_job_groups, config=config, known_group=known_group,
                          batch_id=batch_id)
    return job_records(msgspec.json.decode(data) if data else None,
                       start_job_id=start_job_id, n_jobs=n_jobs,
                       start_job_group_id=start_job_group_id, n_job_groups=n_job_groups,
                       config=config, known_group=known_group, is_developer=is_developer,
                       batch_id=batch_id, texts=texts)
