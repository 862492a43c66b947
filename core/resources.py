"""Instance collections and the normalisation of a job's resource request.

A job asks for ``cpu``, ``memory``, ``storage``, ``machine_type`` and ``preemptible``; submission
turns that into what it will actually get (:class:`schemas.base.JobResources`) and the instance
collection that will run it. The rules follow the reference service:

- ``cpu`` defaults to 1 core and must be a power of two of at least 0.25 cores.
- ``memory`` defaults to ``standard``. ``lowmem``, ``standard`` and ``highmem`` name a worker
  type (``highcpu``, ``standard``, ``highmem``) and give the job that type's memory per core;
  a size (``"3.75Gi"``, ``"500M"``, bytes) lets the cheapest pool that fits it win.
- On a pool, cores grow until the memory fits (at the pool's memory per core), then round up to
  a power of two (at least 0.25) so jobs pack; memory is then cores times memory per core.
- ``storage`` defaults to 0; a positive request is at least 10 GiB and is rounded up to whole
  GiB; more than the maximum disk is unsatisfiable.
- ``machine_type`` sends the job to the job-private collection (an instance of its own): it
  excludes ``cpu`` and ``memory``, and its storage is at least 10 GiB.
- ``preemptible`` defaults to true and must match the pool's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal

import msgspec

from core.errors import BadRequest
from schemas.base import JobResources

WorkerType = Literal["highcpu", "standard", "highmem"]
"""The worker types of the pools, as GCP's n1 family names them."""

MEMORY_CLASSES: Final[Mapping[str, WorkerType]] = {
    "lowmem": "highcpu",
    "standard": "standard",
    "highmem": "highmem",
}
"""Named memory requests and the worker type each one means."""

WORKER_MEMORY_PER_CORE_MIB: Final[Mapping[WorkerType, int]] = {
    "highcpu": 924,  # 0.9 GiB rounded up to a MiB count divisible by 4 (so 1/4 core is whole)
    "standard": 3840,
    "highmem": 6656,
}
"""Memory per core of each worker type (the reference's n1 figures)."""

DEFAULT_CPU: Final = "1"
DEFAULT_MEMORY: Final = "standard"
DEFAULT_STORAGE: Final = "0Gi"
DEFAULT_PREEMPTIBLE: Final = True
JOB_PRIVATE: Final = "job-private"
"""Name of the instance collection that gives a job a machine of its own."""

_GIB: Final = 1024**3
_MIB: Final = 1024**2
_CPU_RE: Final = re.compile(r"\+?((?:[0-9]*\.)?[0-9]+)(m)?")
_SIZE_RE: Final = re.compile(r"\+?((?:[0-9]*\.)?[0-9]+)([KMGTP]i?)?B?")
_SIZE_UNITS: Final[Mapping[str, int]] = {
    "K": 1000, "Ki": 1024, "M": 1000**2, "Mi": 1024**2, "G": 1000**3, "Gi": 1024**3,
    "T": 1000**4, "Ti": 1024**4, "P": 1000**5, "Pi": 1024**5,
}
_MEMORY_PER_CORE_BY_NAME: Final[Mapping[str, int]] = {
    str(k): v for k, v in WORKER_MEMORY_PER_CORE_MIB.items()
}
_MACHINE_TYPE_RE: Final = re.compile(r"(?P<family>[^-]+)-(?P<type>[^-]+)-(?P<cores>\d+)")
_RESOURCE_KEYS: Final = frozenset({"cpu", "memory", "storage", "machine_type", "preemptible"})


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A pool: identical shared workers of one type that pack many jobs each."""

    name: str
    worker_type: WorkerType
    worker_cores: int
    memory_per_core_mib: int
    preemptible: bool = True
    regions: tuple[str, ...] = ("local",)


class InstCollConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every instance collection jobs can land on, and the prices that rank the pools.

    ``cpu_rate`` and ``memory_gib_rate`` are relative hourly prices of a core and of a GiB of
    memory; they only order pools, so any consistent unit works.
    """

    cloud: str = "local"
    pools: tuple[PoolConfig, ...]
    regions: tuple[str, ...] = ("local",)
    machine_types: tuple[str, ...] = ()
    job_private_name: str = JOB_PRIVATE
    min_storage_gib: int = 10
    max_storage_gib: int = 64 * 1024
    cpu_rate: float = 0.031611
    memory_gib_rate: float = 0.004237

    def pool(self, name: str) -> PoolConfig | None:
        """The pool called ``name``, if any."""
        return next((p for p in self.pools if p.name == name), None)


def default_config(
    *,
    cloud: str = "local",
    regions: Sequence[str] = ("local",),
    worker_cores: int = 16,
    with_non_preemptible: bool = True,
) -> InstCollConfig:
    """The configuration of a local deployment: the reference's pools on 16-core workers.

    Pools ``highcpu``, ``standard`` and ``highmem`` are preemptible; with
    ``with_non_preemptible`` each has a ``-np`` twin, as in the reference. Job-private machine
    types are the n1 shapes the reference accepts.

    Args:
        cloud: Name reported by the API and in messages.
        regions: Regions every pool serves; the first is the default region.
        worker_cores: Cores of each pool's workers (the largest cpu a pool job may ask for).
        with_non_preemptible: Also configure non-preemptible pools.

    Returns:
        The configuration.

    """
    region_tuple = tuple(regions)
    pools: list[PoolConfig] = []
    variants = (True, False) if with_non_preemptible else (True,)
    for preemptible in variants:
        for worker_type in ("highcpu", "standard", "highmem"):
            pools.append(
                PoolConfig(
                    name=worker_type if preemptible else f"{worker_type}-np",
                    worker_type=worker_type,
                    worker_cores=worker_cores,
                    memory_per_core_mib=WORKER_MEMORY_PER_CORE_MIB[worker_type],
                    preemptible=preemptible,
                    regions=region_tuple,
                )
            )
    machine_cores: dict[WorkerType, tuple[int, ...]] = {
        "highcpu": (2, 4, 8, 16, 32, 64, 96),
        "standard": (1, 2, 4, 8, 16, 32, 64, 96),
        "highmem": (2, 4, 8, 16, 32, 64, 96),
    }
    machine_types = tuple(
        f"n1-{worker_type}-{cores}" for worker_type, all_cores in machine_cores.items()
        for cores in all_cores
    )
    return InstCollConfig(
        cloud=cloud, pools=tuple(pools), regions=region_tuple, machine_types=machine_types
    )


def parse_cpu_mcpu(value: object) -> int | None:
    """Millicores of a cpu request (``"1"``, ``"0.5"``, ``"250m"``, ``2``), or None if malformed.

    Fractions of a millicore are truncated, as in the reference.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = Decimal(value) if isinstance(value, int) else _decimal(repr(value))
        return None if number is None or number < 0 else int(number * 1000)
    if not isinstance(value, str):
        return None
    match = _CPU_RE.fullmatch(value)
    if match is None:
        return None
    number = Decimal(match.group(1))
    if match.group(2) == "m":
        return int(number)
    return int(number * 1000)


def parse_size_bytes(value: object) -> int | None:
    """Bytes of a memory or storage size (``"3.75Gi"``, ``"1G"``, ``"500Mi"``, ``1024``).

    Returns None if ``value`` is malformed. Fractions of a byte round up, as in the reference.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        number = _decimal(repr(value))
        return None if number is None or number < 0 else _ceil(number)
    if not isinstance(value, str):
        return None
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        return None
    number = Decimal(match.group(1))
    unit = match.group(2)
    return _ceil(number * _SIZE_UNITS[unit] if unit else number)


def is_valid_cores_mcpu(cores_mcpu: int) -> bool:
    """Whether a cpu request is a power of two of at least a quarter core."""
    if cores_mcpu <= 0 or cores_mcpu % 250 != 0:
        return False
    quarters = cores_mcpu // 250
    return quarters & (quarters - 1) == 0


def packable_cores_mcpu(cores_mcpu: int) -> int:
    """The smallest power of two of cores (at least 0.25) that holds ``cores_mcpu``."""
    packed = 250
    while packed < cores_mcpu:
        packed *= 2
    return packed


def normalize_resources(
    resources: Mapping[str, Any] | None,
    *,
    config: InstCollConfig,
    regions: Sequence[str] | None = None,
    job: str = "job",
    name: str = "resources",
) -> tuple[JobResources, str]:
    """Turn a job's resource request into what it gets and where it runs.

    Args:
        resources: The job spec's ``resources`` object (None means all defaults). Keys with a
            null value count as absent.
        config: The instance collections.
        regions: The job's ``regions``, or None for any region.
        job: How messages name the job, e.g. ``"(1, 3)"`` as the reference does.
        name: How messages name the ``resources`` object, e.g. ``"jobs[0].resources"``.

    Returns:
        The normalised resources and the name of the chosen instance collection.

    Raises:
        BadRequest: The request is malformed or no instance collection can satisfy it.

    """
    if resources is None:
        resources = {}
    if not isinstance(resources, Mapping):
        raise BadRequest(f"{name} is not an object")
    unknown = sorted(str(k) for k in resources if k not in _RESOURCE_KEYS)
    if unknown:
        raise BadRequest(f"unknown keys in {name}: {{{', '.join(map(repr, unknown))}}}")
    res = {k: v for k, v in resources.items() if v is not None}

    preemptible = res.get("preemptible", DEFAULT_PREEMPTIBLE)
    if not isinstance(preemptible, bool):
        raise BadRequest(f"{name}.preemptible must be true or false")
    machine_type = res.get("machine_type")
    if machine_type == "":
        machine_type = None  # the reference treats an empty machine type as none
    if machine_type is not None and not isinstance(machine_type, str):
        raise BadRequest(f"{name}.machine_type must be a string")
    region_list = _check_regions(regions, config)

    storage_raw = res.get("storage", DEFAULT_STORAGE)
    storage_bytes = parse_size_bytes(storage_raw)
    if storage_bytes is None:
        raise BadRequest(
            f"bad resource request for job {job}: storage must be convertable to bytes; "
            f"found {storage_raw}"
        )

    def unsatisfiable() -> BadRequest:
        return BadRequest(
            f"resource requests for job {job} are unsatisfiable: cloud={config.cloud}, "
            f"cpu={None if machine_type else res.get('cpu', DEFAULT_CPU)}, "
            f"memory={None if machine_type else res.get('memory', DEFAULT_MEMORY)}, "
            f"storage={storage_raw}, preemptible={preemptible}, machine_type={machine_type}"
        )

    if machine_type is not None:
        if machine_type not in config.machine_types:
            raise BadRequest(f"unknown machine type {machine_type} for cloud {config.cloud}")
        if "cpu" in res or "memory" in res:
            raise BadRequest("cannot specify cpu and memory with machine_type")
        private = _job_private(config, machine_type, storage_bytes)
        if private is None:
            raise unsatisfiable()
        cores_mcpu, memory_bytes, storage_gib = private
        normalized = JobResources(
            cores_mcpu=cores_mcpu, memory_bytes=memory_bytes, storage_gib=storage_gib,
            machine_type=machine_type, preemptible=preemptible, regions=region_list,
        )
        return normalized, config.job_private_name

    cpu_raw = res.get("cpu", DEFAULT_CPU)
    req_mcpu = parse_cpu_mcpu(cpu_raw)
    if req_mcpu is None or not is_valid_cores_mcpu(req_mcpu):
        raise BadRequest(
            f"bad resource request for job {job}: cpu must be a power of two with a min of "
            f"0.25; found {cpu_raw}."
        )
    memory_raw = res.get("memory", DEFAULT_MEMORY)
    candidates = [
        p for p in config.pools
        if p.preemptible == preemptible
        and (region_list is None or not set(p.regions).isdisjoint(region_list))
    ]
    if isinstance(memory_raw, str) and memory_raw in MEMORY_CLASSES:
        worker_type = MEMORY_CLASSES[memory_raw]
        chosen = _first_fit(
            [p for p in candidates if p.worker_type == worker_type], config, req_mcpu,
            None, storage_bytes,
        )
    else:
        req_memory_bytes = parse_size_bytes(memory_raw)
        if req_memory_bytes is None:
            raise BadRequest(
                f"{name}.memory must be lowmem, standard, highmem or a size such as '3.75Gi'; "
                f"found {memory_raw}"
            )
        chosen = _cheapest_fit(candidates, config, req_mcpu, req_memory_bytes, storage_bytes)
    if chosen is None:
        raise unsatisfiable()
    pool, (cores_mcpu, memory_bytes, storage_gib) = chosen
    normalized = JobResources(
        cores_mcpu=cores_mcpu, memory_bytes=memory_bytes, storage_gib=storage_gib,
        preemptible=preemptible, regions=region_list,
    )
    return normalized, pool.name


def fit_on_pool(
    pool: PoolConfig, config: InstCollConfig, cores_mcpu: int, memory_bytes: int | None,
    storage_bytes: int,
) -> tuple[int, int, int] | None:
    """What a request becomes on ``pool``: ``(cores_mcpu, memory_bytes, storage_gib)``.

    ``memory_bytes`` None means "the pool's memory per core". Returns None if it does not fit
    on one of the pool's workers.
    """
    storage_gib = _storage_gib(config, storage_bytes, allow_zero=True)
    if storage_gib is None:
        return None
    per_core_bytes = pool.memory_per_core_mib * _MIB
    if memory_bytes is not None:
        cores_mcpu = max(cores_mcpu, -(-memory_bytes * 1000 // per_core_bytes))
    cores_mcpu = packable_cores_mcpu(cores_mcpu)
    if cores_mcpu > pool.worker_cores * 1000:
        return None
    return cores_mcpu, cores_mcpu * per_core_bytes // 1000, storage_gib


def _first_fit(
    pools: Sequence[PoolConfig], config: InstCollConfig, cores_mcpu: int,
    memory_bytes: int | None, storage_bytes: int,
) -> tuple[PoolConfig, tuple[int, int, int]] | None:
    for pool in pools:
        fitted = fit_on_pool(pool, config, cores_mcpu, memory_bytes, storage_bytes)
        if fitted is not None:
            return pool, fitted
    return None


def _cheapest_fit(
    pools: Sequence[PoolConfig], config: InstCollConfig, cores_mcpu: int,
    memory_bytes: int, storage_bytes: int,
) -> tuple[PoolConfig, tuple[int, int, int]] | None:
    best: tuple[PoolConfig, tuple[int, int, int]] | None = None
    best_cost = 0.0
    for pool in pools:
        fitted = fit_on_pool(pool, config, cores_mcpu, memory_bytes, storage_bytes)
        if fitted is None:
            continue
        # Storage costs the same on every pool, so cores and memory alone rank them.
        cost = fitted[0] / 1000 * config.cpu_rate + fitted[1] / _GIB * config.memory_gib_rate
        if best is None or cost < best_cost:
            best, best_cost = (pool, fitted), cost
    return best


def _job_private(
    config: InstCollConfig, machine_type: str, storage_bytes: int
) -> tuple[int, int, int] | None:
    storage_gib = _storage_gib(config, storage_bytes, allow_zero=False)
    match = _MACHINE_TYPE_RE.fullmatch(machine_type)
    if storage_gib is None or match is None:
        return None
    per_core_mib = _MEMORY_PER_CORE_BY_NAME.get(match.group("type"))
    if per_core_mib is None:
        return None
    cores_mcpu = int(match.group("cores")) * 1000
    return cores_mcpu, cores_mcpu * per_core_mib * _MIB // 1000, storage_gib


def _storage_gib(config: InstCollConfig, storage_bytes: int, *, allow_zero: bool) -> int | None:
    if storage_bytes > config.max_storage_gib * _GIB:
        return None
    if allow_zero and storage_bytes == 0:
        return 0
    return max(config.min_storage_gib, -(-storage_bytes // _GIB))


def _check_regions(regions: Sequence[str] | None, config: InstCollConfig) -> list[str] | None:
    if regions is None:
        return None
    region_list = list(regions)
    if not region_list:
        raise BadRequest("regions must not be an empty array")
    invalid = sorted(set(region_list).difference(config.regions))
    if invalid:
        valid = sorted(config.regions)
        raise BadRequest(
            f"invalid regions specified: {{{', '.join(map(repr, invalid))}}}. "
            f"Choose from {{{', '.join(map(repr, valid))}}}"
        )
    return region_list


def _decimal(text: str) -> Decimal | None:
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _ceil(number: Decimal) -> int:
    return int(number.to_integral_value(rounding="ROUND_CEILING"))
