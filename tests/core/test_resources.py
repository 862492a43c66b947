from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import BadRequest, DomainError
from core.resources import (
    JOB_PRIVATE,
    WORKER_MEMORY_PER_CORE_MIB,
    InstCollConfig,
    default_config,
    fit_on_pool,
    is_valid_cores_mcpu,
    normalize_resources,
    packable_cores_mcpu,
    parse_cpu_mcpu,
    parse_size_bytes,
)
from schemas.base import JobResources

CONFIG = default_config()
MI = 1024**2
GI = 1024**3


@pytest.mark.parametrize(
    ("value", "mcpu"),
    [("1", 1000), ("0.5", 500), ("250m", 250), ("+2", 2000), (".25", 250), ("1.5m", 1),
     (2, 2000), (0.25, 250), ("0", 0), ("abc", None), ("-1", None), ("1e3", None), (-1, None),
     (True, None), (None, None), ([1], None), ("1 ", None)],
    ids=repr,
)
def test_parse_cpu(value: Any, mcpu: int | None) -> None:
    assert parse_cpu_mcpu(value) == mcpu


@pytest.mark.parametrize(
    ("value", "n_bytes"),
    [("3.75Gi", 3840 * MI), ("500Mi", 500 * MI), ("1G", 10**9), ("1GB", 10**9), ("1Ki", 1024),
     ("1024", 1024), (1024, 1024), ("0.1Gi", 107374183), ("1.5", 2), ("2Ti", 2 * 1024**4),
     ("1P", 10**15), (2.5, 3), ("x", None), ("1Gb", None), ("-5", None), (-5, None),
     (True, None), ({}, None)],
    ids=repr,
)
def test_parse_size(value: Any, n_bytes: int | None) -> None:
    assert parse_size_bytes(value) == n_bytes


@pytest.mark.parametrize(
    ("mcpu", "valid", "packed"),
    [(250, True, 250), (500, True, 500), (1000, True, 1000), (16000, True, 16000),
     (1, False, 250), (300, False, 500), (750, False, 1000), (3000, False, 4000),
     (0, False, 250), (-250, False, 250)],
    ids=str,
)
def test_valid_and_packable_cores(mcpu: int, valid: bool, packed: int) -> None:
    assert is_valid_cores_mcpu(mcpu) is valid
    assert packable_cores_mcpu(mcpu) == packed


def test_default_config() -> None:
    names = [p.name for p in CONFIG.pools]
    assert names == ["highcpu", "standard", "highmem", "highcpu-np", "standard-np", "highmem-np"]
    assert all(p.worker_cores == 16 and p.regions == ("local",) for p in CONFIG.pools)
    assert CONFIG.pool("highmem-np") is not None and CONFIG.pool("nope") is None
    assert "n1-standard-4" in CONFIG.machine_types and "n1-highcpu-1" not in CONFIG.machine_types
    only_preemptible = default_config(with_non_preemptible=False, worker_cores=4)
    assert [p.name for p in only_preemptible.pools] == ["highcpu", "standard", "highmem"]


def res(cores: int, memory: int, storage: int = 0, **kw: Any) -> JobResources:
    return JobResources(cores_mcpu=cores, memory_bytes=memory, storage_gib=storage, **kw)


@pytest.mark.parametrize(
    ("resources", "regions", "expected", "inst_coll"),
    [
        (None, None, res(1000, 3840 * MI), "standard"),
        ({}, None, res(1000, 3840 * MI), "standard"),
        ({"cpu": None, "memory": None}, None, res(1000, 3840 * MI), "standard"),
        ({"cpu": "0.25", "memory": "lowmem"}, None, res(250, 231 * MI), "highcpu"),
        ({"cpu": "2", "memory": "highmem"}, None, res(2000, 2 * 6656 * MI), "highmem"),
        ({"cpu": "250m"}, None, res(250, 960 * MI), "standard"),
        ({"cpu": 4}, None, res(4000, 4 * 3840 * MI), "standard"),
        ({"cpu": "16"}, None, res(16000, 16 * 3840 * MI), "standard"),
        ({"memory": "3.75Gi"}, None, res(1000, 3840 * MI), "standard"),
        ({"memory": "500Mi"}, None, res(1000, 924 * MI), "highcpu"),
        ({"memory": "20Gi"}, None, res(4000, 4 * 6656 * MI), "highmem"),
        ({"memory": 4 * GI, "cpu": "0.5"}, None, res(1000, 6656 * MI), "highmem"),
        ({"storage": "1Gi"}, None, res(1000, 3840 * MI, 10), "standard"),
        ({"storage": "10.5Gi"}, None, res(1000, 3840 * MI, 11), "standard"),
        ({"storage": "100G"}, None, res(1000, 3840 * MI, 94), "standard"),
        ({"storage": "0"}, None, res(1000, 3840 * MI, 0), "standard"),
        ({"preemptible": False}, None, res(1000, 3840 * MI, preemptible=False), "standard-np"),
        ({"memory": "lowmem", "preemptible": False}, None,
         res(1000, 924 * MI, preemptible=False), "highcpu-np"),
        ({"machine_type": "n1-standard-4"}, None,
         res(4000, 4 * 3840 * MI, 10, machine_type="n1-standard-4"), JOB_PRIVATE),
        ({"machine_type": "n1-highmem-8", "storage": "100Gi", "preemptible": False}, None,
         res(8000, 8 * 6656 * MI, 100, machine_type="n1-highmem-8", preemptible=False),
         JOB_PRIVATE),
        ({"machine_type": ""}, None, res(1000, 3840 * MI), "standard"),
        (None, ["local"], res(1000, 3840 * MI, regions=["local"]), "standard"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, JobResources) else "",
)
def test_normalize(resources: Any, regions: list[str] | None, expected: JobResources,
                   inst_coll: str) -> None:
    assert normalize_resources(resources, config=CONFIG, regions=regions) == (expected, inst_coll)


UNSAT = "resource requests for job j are unsatisfiable: cloud=local, "


@pytest.mark.parametrize(
    ("resources", "regions", "message"),
    [
        ({"cpu": "3"}, None,
         "bad resource request for job j: cpu must be a power of two with a min of 0.25; "
         "found 3."),
        ({"cpu": "0.1"}, None, "cpu must be a power of two with a min of 0.25; found 0.1."),
        ({"cpu": "abc"}, None, "cpu must be a power of two with a min of 0.25; found abc."),
        ({"cpu": True}, None, "cpu must be a power of two"),
        ({"memory": "lots"}, None,
         "resources.memory must be lowmem, standard, highmem or a size such as '3.75Gi'; "
         "found lots"),
        ({"storage": "big"}, None,
         "bad resource request for job j: storage must be convertable to bytes; found big"),
        ({"cpu": "32"}, None,
         UNSAT + "cpu=32, memory=standard, storage=0Gi, preemptible=True, machine_type=None"),
        ({"memory": "2000Gi"}, None, UNSAT + "cpu=1, memory=2000Gi, storage=0Gi"),
        ({"storage": "65537Gi"}, None, UNSAT + "cpu=1, memory=standard, storage=65537Gi"),
        ({"machine_type": "n1-standard-4", "storage": "65537Gi"}, None,
         UNSAT + "cpu=None, memory=None, storage=65537Gi, preemptible=True, "
         "machine_type=n1-standard-4"),
        ({"machine_type": "n1-standard-3"}, None,
         "unknown machine type n1-standard-3 for cloud local"),
        ({"machine_type": "n1-standard-4", "cpu": "1"}, None,
         "cannot specify cpu and memory with machine_type"),
        ({"machine_type": "n1-standard-4", "memory": "standard"}, None,
         "cannot specify cpu and memory with machine_type"),
        ({"foo": 1, "bar": 2}, None, "unknown keys in resources: {'bar', 'foo'}"),
        ({"preemptible": "yes"}, None, "resources.preemptible must be true or false"),
        ({"machine_type": 5}, None, "resources.machine_type must be a string"),
        ({"machine_type": False}, None, "resources.machine_type must be a string"),
        ([], None, "resources is not an object"),
        (None, [], "regions must not be an empty array"),
        (None, ["us-central1", "local"],
         "invalid regions specified: {'us-central1'}. Choose from {'local'}"),
    ],
    ids=lambda v: repr(v),
)
def test_normalize_errors(resources: Any, regions: list[str] | None, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as info:
        normalize_resources(resources, config=CONFIG, regions=regions, job="j")
    assert info.value.status == 400


def test_no_non_preemptible_pool_is_unsatisfiable() -> None:
    config = default_config(with_non_preemptible=False)
    with pytest.raises(BadRequest, match="preemptible=False"):
        normalize_resources({"preemptible": False}, config=config, job="j")


def test_pools_outside_the_requested_regions_are_skipped() -> None:
    config = InstCollConfig(
        pools=tuple(p if p.name != "standard" else
                    type(p)(name="standard-east", worker_type="standard", worker_cores=16,
                            memory_per_core_mib=3840, regions=("east",))
                    for p in CONFIG.pools[:3]),
        regions=("local", "east"),
    )
    assert normalize_resources(None, config=config, regions=["east"])[1] == "standard-east"
    with pytest.raises(BadRequest, match="unsatisfiable"):
        normalize_resources(None, config=config, regions=["local"])


# --- properties --------------------------------------------------------------------------------

cpu_requests = st.one_of(
    st.sampled_from(["0.25", "0.5", "1", "2", "4", "8", "16", "32", "250m", "500m", "3", "0.1"]),
    st.integers(0, 64), st.floats(0, 64, allow_nan=False),
)
memory_requests = st.one_of(
    st.sampled_from(["lowmem", "standard", "highmem"]),
    st.integers(0, 200 * GI),
    st.builds(lambda n, unit: f"{n}{unit}", st.integers(0, 300),
              st.sampled_from(["Mi", "Gi", "G", "M", ""])),
)


@given(cpu=cpu_requests, memory=memory_requests, preemptible=st.booleans())
def test_accepted_requests_fit_their_pool(cpu: Any, memory: Any, preemptible: bool) -> None:
    request = {"cpu": cpu, "memory": memory, "preemptible": preemptible}
    try:
        resources, inst_coll = normalize_resources(request, config=CONFIG)
    except BadRequest:
        return
    pool = CONFIG.pool(inst_coll)
    assert pool is not None and pool.preemptible == preemptible
    requested_mcpu = parse_cpu_mcpu(cpu)
    assert requested_mcpu is not None
    assert is_valid_cores_mcpu(resources.cores_mcpu)
    assert requested_mcpu <= resources.cores_mcpu <= pool.worker_cores * 1000
    assert resources.memory_bytes == resources.cores_mcpu * pool.memory_per_core_mib * MI // 1000
    if memory in ("lowmem", "standard", "highmem"):
        assert pool.worker_type == {"lowmem": "highcpu"}.get(memory, memory)
    else:
        requested_bytes = parse_size_bytes(memory)
        assert requested_bytes is not None and requested_bytes <= resources.memory_bytes
        # No other pool could have held it for less.
        for other in CONFIG.pools:
            fitted = fit_on_pool(other, CONFIG, requested_mcpu, requested_bytes, 0)
            if fitted is not None and other.preemptible == preemptible:
                cost = fitted[0] / 1000 * CONFIG.cpu_rate + fitted[1] / GI * CONFIG.memory_gib_rate
                chosen = (resources.cores_mcpu / 1000 * CONFIG.cpu_rate
                          + resources.memory_bytes / GI * CONFIG.memory_gib_rate)
                assert chosen <= cost


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
resource_like = st.dictionaries(
    st.sampled_from(["cpu", "memory", "storage", "machine_type", "preemptible", "other"]),
    json_values | cpu_requests | memory_requests, max_size=5,
)


@given(resources=resource_like | json_values,
       regions=st.none() | st.lists(st.sampled_from(["local", "x"]), max_size=2))
def test_normalize_only_raises_domain_errors(resources: Any, regions: list[str] | None) -> None:
    try:
        normalized, inst_coll = normalize_resources(resources, config=CONFIG, regions=regions)
    except DomainError:
        return
    assert inst_coll == JOB_PRIVATE or CONFIG.pool(inst_coll) is not None
    assert normalized.memory_bytes >= 0 and normalized.storage_gib >= 0


def test_memory_per_core_table() -> None:
    assert WORKER_MEMORY_PER_CORE_MIB == {"highcpu": 924, "standard": 3840, "highmem": 6656}
    # A quarter core gets a whole number of MiB on every worker type.
    assert all(mib % 4 == 0 for mib in WORKER_MEMORY_PER_CORE_MIB.values())
