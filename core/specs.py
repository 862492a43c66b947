"""Validation of the submission API's batch, update and job-group bodies.

Every function takes decoded JSON (``Any``) and either returns typed values or raises
:class:`core.errors.BadRequest` with a message naming the offending key (``batch.n_jobs``,
``job_groups[2].in_update_parent_id``). Nothing here looks anything up: what only the log or a
projection knows (does a job group exist, how deep is it) is passed in as a function, so the
checks stay pure. Job specs are in :mod:`core.job_specs`.

Ids: an update reserves job ids ``[start_job_id, start_job_id + n_jobs)`` and job-group ids
alike. ``in_update_*`` ids count from 1 within the update and map to ``start + id - 1``; in the
batch's first group-bearing update (``start_job_group_id == 1``) ``in_update_*`` id 0 is the root
group, which is what the client sends for the root before the batch exists.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, NamedTuple

import msgspec

from core.errors import BadRequest, counted, listed, reserved
from schemas.batch import JobGroupRecord

MAX_BUNCH_SIZE: Final = 1024
"""Most specs (jobs plus job groups) one request may carry."""

ROOT_JOB_GROUP_ID: Final = 0
MAX_JOB_GROUPS_DEPTH: Final = 2
"""Most levels of job groups below the root group."""


# --- field checks shared with core.job_specs ---------------------------------------------------


def expect_object(
    name: str, obj: Any, *, allowed: Collection[str], required: Sequence[str] = ()
) -> dict[str, Any]:
    """Check that ``obj`` is a JSON object with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(obj, dict):
        raise BadRequest(f"{name} is not an object")
    if not all(k in allowed for k in obj):
        unknown = sorted(str(k) for k in obj if k not in allowed)
        raise BadRequest(f"unknown keys in {name}: {{{', '.join(map(repr, unknown))}}}")
    for key in required:
        if key not in obj:
            raise BadRequest(f"{name} missing required key {key}.")
    return obj


def expect_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Check that ``value`` is an integer (not a boolean), at least ``minimum`` if given."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} is not an integer")
    if minimum is not None and value < minimum:
        condition = "x > 0" if minimum == 1 else f"x >= {minimum}"
        raise BadRequest(f"{name} does not satisfy the condition {condition}")
    return value


def expect_str(name: str, value: Any, *, non_empty: bool = False) -> str:
    """Check that ``value`` is a string (and not empty, if asked)."""
    if not isinstance(value, str):
        raise BadRequest(f"{name} is not a string")
    if non_empty and not value:
        raise BadRequest(f"{name} must not be empty")
    return value


def expect_bool(name: str, value: Any) -> bool:
    """Check that ``value`` is true or false."""
    if not isinstance(value, bool):
        raise BadRequest(f"{name} is not a boolean")
    return value


def expect_list(name: str, value: Any) -> list[Any]:
    """Check that ``value`` is a JSON array."""
    if not isinstance(value, list):
        raise BadRequest(f"{name} is not a list")
    return value


def expect_str_list(name: str, value: Any) -> list[str]:
    """Check that ``value`` is an array of strings."""
    if type(value) is list and all(type(v) is str for v in value):
        return value  # the usual case, without naming each element
    return [expect_str(f"{name}[{i}]", v) for i, v in enumerate(expect_list(name, value))]


def expect_int_list(name: str, value: Any) -> list[int]:
    """Check that ``value`` is an array of integers."""
    if type(value) is list and all(type(v) is int for v in value):
        return value  # the usual case (bool is not int here), without naming each element
    return [expect_int(f"{name}[{i}]", v) for i, v in enumerate(expect_list(name, value))]


def expect_str_dict(name: str, value: Any) -> dict[str, str]:
    """Check that ``value`` is an object whose values are strings."""
    if not isinstance(value, dict):
        raise BadRequest(f"{name} is not an object")
    for key, item in value.items():
        if not isinstance(key, str):
            raise BadRequest(f"{name} has a non-string key")
        expect_str(f"{name}[{key}]", item)
    return dict(value)


def optional(spec: dict[str, Any], key: str) -> Any:
    """The value of ``key`` in ``spec``; absent and null both give None."""
    return spec.get(key)


def expect_bunch(name: str, value: Any) -> list[Any]:
    """Check that ``value`` is an array of at most :data:`MAX_BUNCH_SIZE` specs."""
    items = expect_list(name, value)
    if len(items) > MAX_BUNCH_SIZE:
        raise BadRequest(
            f"{name} has {len(items)} specs; a bunch holds at most {MAX_BUNCH_SIZE}"
        )
    return items


def resolve_in_update_id(in_update_id: int, start_id: int) -> int:
    """The absolute id of an ``in_update_*`` id of an update that starts at ``start_id``."""
    return start_id + in_update_id - 1


# --- batches and updates ---------------------------------------------------------------------


class BatchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A validated batch spec (``POST /batches/create`` and create-fast's ``batch``)."""

    billing_project: str
    token: str
    n_jobs: int
    n_job_groups: int = 0
    attributes: dict[str, str] = {}
    callback: str | None = None
    cancel_after_n_failures: int | None = None


class UpdateSpec(NamedTuple):
    """A validated update spec (``/updates/create`` and update-fast's ``update``)."""

    n_jobs: int
    n_job_groups: int
    token: str


_BATCH_KEYS: Final = frozenset(
    {"billing_project", "n_jobs", "n_job_groups", "token", "attributes", "callback",
     "cancel_after_n_failures"}
)
_UPDATE_KEYS: Final = frozenset({"n_jobs", "n_job_groups", "token"})
_GROUP_KEYS: Final = frozenset(
    {"job_group_id", "absolute_parent_id", "in_update_parent_id", "attributes", "callback",
     "cancel_after_n_failures"}
)


def parse_batch_spec(obj: Any) -> BatchSpec:
    """Validate a batch spec.

    Args:
        obj: The decoded JSON body.

    Returns:
        The spec; null ``attributes`` become ``{}``, a missing ``n_job_groups`` is 0.

    Raises:
        BadRequest: A key is unknown, missing or of the wrong type, or a count is negative.

    """
    spec = expect_object("batch", obj, allowed=_BATCH_KEYS,
                         required=("billing_project", "n_jobs", "token"))
    attributes = optional(spec, "attributes")
    callback = optional(spec, "callback")
    cancel_after = optional(spec, "cancel_after_n_failures")
    n_job_groups = optional(spec, "n_job_groups")
    return BatchSpec(
        billing_project=expect_str("batch.billing_project", spec["billing_project"]),
        token=expect_str("batch.token", spec["token"]),
        n_jobs=expect_int("batch.n_jobs", spec["n_jobs"], minimum=0),
        n_job_groups=0 if n_job_groups is None
        else expect_int("batch.n_job_groups", n_job_groups, minimum=0),
        attributes={} if attributes is None else expect_str_dict("batch.attributes", attributes),
        callback=None if callback is None else expect_str("batch.callback", callback),
        cancel_after_n_failures=None if cancel_after is None
        else expect_int("batch.cancel_after_n_failures", cancel_after, minimum=1),
    )


def parse_update_spec(obj: Any) -> UpdateSpec:
    """Validate an update spec ``{n_jobs, n_job_groups, token}``.

    Args:
        obj: The decoded JSON body (or update-fast's ``update``).

    Returns:
        ``(n_jobs, n_job_groups, token)``; a missing ``n_job_groups`` is 0.

    Raises:
        BadRequest: A key is unknown, missing or of the wrong type, or a count is negative.

    """
    spec = expect_object("batch_update", obj, allowed=_UPDATE_KEYS, required=("n_jobs", "token"))
    n_job_groups = optional(spec, "n_job_groups")
    return UpdateSpec(
        n_jobs=expect_int("batch_update.n_jobs", spec["n_jobs"], minimum=0),
        n_job_groups=0 if n_job_groups is None
        else expect_int("batch_update.n_job_groups", n_job_groups, minimum=0),
        token=expect_str("batch_update.token", spec["token"]),
    )


def parse_create_fast(obj: Any) -> tuple[BatchSpec, list[Any], list[Any]]:
    """Split a create-fast body ``{batch, job_groups, bunch}`` and validate the batch spec.

    Returns:
        The batch spec, the job-group specs and the job specs (the latter two unvalidated:
        pass them to :func:`job_group_records` and :func:`core.job_specs.job_records`).

    Raises:
        BadRequest: The body is malformed or carries more than :data:`MAX_BUNCH_SIZE` specs.

    """
    body = expect_object("body", obj, allowed=("batch", "bunch", "job_groups"),
                         required=("batch", "bunch"))
    groups, jobs = _fast_bunches(body)
    return parse_batch_spec(body["batch"]), groups, jobs


def parse_update_fast(obj: Any) -> tuple[UpdateSpec, list[Any], list[Any]]:
    """Split an update-fast body ``{update, job_groups, bunch}`` and validate the update spec.

    Returns:
        The update spec, the job-group specs and the job specs (the latter two unvalidated).

    Raises:
        BadRequest: The body is malformed or carries more than :data:`MAX_BUNCH_SIZE` specs.

    """
    body = expect_object("body", obj, allowed=("update", "bunch", "job_groups"),
                         required=("update", "bunch"))
    groups, jobs = _fast_bunches(body)
    return parse_update_spec(body["update"]), groups, jobs


def _fast_bunches(body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    raw_groups = optional(body, "job_groups")
    groups = [] if raw_groups is None else expect_list("job_groups", raw_groups)
    jobs = expect_list("bunch", body["bunch"])
    if len(groups) + len(jobs) > MAX_BUNCH_SIZE:
        raise BadRequest(
            f"bunch has {len(groups) + len(jobs)} specs; a bunch holds at most {MAX_BUNCH_SIZE}"
        )
    return groups, jobs


# --- job groups ------------------------------------------------------------------------------


class _GroupSpec(NamedTuple):
    name: str
    in_update_id: int
    absolute_parent_id: int | None
    in_update_parent_id: int | None
    attributes: dict[str, str]
    callback: str | None
    cancel_after_n_failures: int | None


def job_group_records(
    objs: Any,
    *,
    start_job_group_id: int,
    n_job_groups: int,
    depth_of: Callable[[int], int | None],
) -> list[JobGroupRecord]:
    """Validate a bunch of job-group specs of an update and resolve their ids.

    Args:
        objs: The decoded JSON array of job-group specs.
        start_job_group_id: The update's first job-group id.
        n_job_groups: How many job groups the update reserved.
        depth_of: Depth below the root (root = 0) of an existing job group that is not in this
            bunch (earlier updates, earlier bunches of this update), or None if there is no
            such group.

    Returns:
        One record per spec, in order, with absolute ``job_group_id`` and ``parent_id``.

    Raises:
        BadRequest: A spec is malformed, an id is out of the update's range or not contiguous,
            a parent does not exist or comes after its child, or nesting is too deep.

    """
    specs = [_parse_group(f"job_groups[{i}]", obj)
             for i, obj in enumerate(expect_bunch("job_groups", objs))]
    out_of_range = [s.in_update_id for s in specs if not 1 <= s.in_update_id <= n_job_groups]
    if out_of_range:
        raise BadRequest(f"job group ids {listed(out_of_range)} are out of range"
                         f"{counted(out_of_range)}: "
                         f"{reserved('job group', n_job_groups)}")
    for before, after in itertools.pairwise(specs):
        if after.in_update_id != before.in_update_id + 1:
            raise BadRequest(
                f"noncontiguous job group ids found in the spec: "
                f"{before.in_update_id} -> {after.in_update_id}"
            )

    depths: dict[int, int] = {}
    records: list[JobGroupRecord] = []
    for spec in specs:
        group_id = resolve_in_update_id(spec.in_update_id, start_job_group_id)
        parent_id = _resolve_group_parent(spec, start_job_group_id, group_id)
        parent_depth = depths[parent_id] if parent_id in depths else depth_of(parent_id)
        if parent_depth is None:
            raise BadRequest(f"job group parent {parent_id} does not exist")
        if parent_depth + 1 > MAX_JOB_GROUPS_DEPTH:
            raise BadRequest("job group exceeded the maximum level of nesting")
        depths[group_id] = parent_depth + 1
        records.append(JobGroupRecord(
            job_group_id=group_id,
            parent_id=parent_id,
            attributes=spec.attributes,
            callback=spec.callback,
            cancel_after_n_failures=spec.cancel_after_n_failures,
        ))
    return records


def _parse_group(name: str, obj: Any) -> _GroupSpec:
    spec = expect_object(name, obj, allowed=_GROUP_KEYS, required=("job_group_id",))
    absolute = optional(spec, "absolute_parent_id")
    in_update = optional(spec, "in_update_parent_id")
    if (absolute is None) == (in_update is None):
        raise BadRequest(
            f"{name} must have exactly one of absolute_parent_id and in_update_parent_id"
        )
    attributes = optional(spec, "attributes")
    callback = optional(spec, "callback")
    cancel_after = optional(spec, "cancel_after_n_failures")
    return _GroupSpec(
        name=name,
        in_update_id=expect_int(f"{name}.job_group_id", spec["job_group_id"]),
        absolute_parent_id=None if absolute is None
        else expect_int(f"{name}.absolute_parent_id", absolute),
        in_update_parent_id=None if in_update is None
        else expect_int(f"{name}.in_update_parent_id", in_update),
        attributes={} if attributes is None
        else expect_str_dict(f"{name}.attributes", attributes),
        callback=None if callback is None else expect_str(f"{name}.callback", callback),
        cancel_after_n_failures=None if cancel_after is None
        else expect_int(f"{name}.cancel_after_n_failures", cancel_after, minimum=1),
    )


def _resolve_group_parent(spec: _GroupSpec, start_job_group_id: int, group_id: int) -> int:
    if spec.in_update_parent_id is not None:
        parent = spec.in_update_parent_id
        if parent == 0 and start_job_group_id == 1:
            return ROOT_JOB_GROUP_ID
        if 1 <= parent < spec.in_update_id:
            return resolve_in_update_id(parent, start_job_group_id)
        raise BadRequest(
            f"{spec.name}.in_update_parent_id is {parent}: it must name an earlier job group "
            f"of this update (1 to {spec.in_update_id - 1})"
            + (", or 0 for the root job group" if start_job_group_id == 1 else "")
        )
    assert spec.absolute_parent_id is not None
    parent = spec.absolute_parent_id
    if not 0 <= parent < group_id:
        # A group's parent is always created before it, so a larger id cannot exist yet.
        raise BadRequest(f"job group parent {parent} does not exist")
    return parent
