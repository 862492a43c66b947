"""The CPU a process may use: its cores capped by its cgroups' quotas (core.cpu_capacity)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.cpu_capacity import (
    ancestry,
    capacity,
    cgroup_path,
    parse_cfs,
    parse_cpu_max,
    whole_cores,
)

quotas = st.lists(st.none() | st.tuples(st.integers(1_000, 10**7), st.integers(1_000, 10**6)),
                  max_size=5)


@given(st.integers(1, 256), quotas)
def test_the_capacity_is_the_smallest_limit(cores: int, levels: list[tuple[int, int] | None]
                                            ) -> None:
    got = capacity(cores, levels)
    limits = [cores] + [q / p for q, p in (lv for lv in levels if lv is not None)]
    assert got == min(limits)
    assert 0 < got <= cores
    assert 1 <= whole_cores(got) <= cores
    assert whole_cores(got) - 1 < got <= whole_cores(got) or whole_cores(got) == 1


def test_examples() -> None:
    assert capacity(2, []) == 2.0
    assert capacity(2, [None, (100_000, 100_000), None]) == 1.0
    assert capacity(8, [(150_000, 100_000), (300_000, 100_000)]) == 1.5
    assert capacity(0, []) == 1.0  # an empty affinity reads as one core
    assert [whole_cores(c) for c in (0.2, 1.0, 1.5, 2.0, 1.0000000001)] == [1, 1, 2, 2, 1]


def test_cpu_max_and_cfs_files() -> None:
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("50000 100000\n") == (50_000, 100_000)
    assert parse_cpu_max("max") is None
    assert parse_cfs("-1\n", "100000\n") is None
    assert parse_cfs("10000\n", "10000\n") == (10_000, 10_000)
    for bad in ("", "a b", "0 100000", "1 2 3", "-5 100"):
        with pytest.raises(ValueError):
            parse_cpu_max(bad)
    with pytest.raises(ValueError):
        parse_cfs("0", "100000")


def test_the_cgroup_path_of_each_layout() -> None:
    v1 = "9:name=systemd:/\n4:memory:/x\n2:cpuacct:/\n1:cpu,cpuacct:/pods/a\n0::/\n"
    assert cgroup_path(v1, v2=False) == "/pods/a"
    assert cgroup_path(v1, v2=True) == "/"
    assert cgroup_path("0::/user.slice/x\n", v2=True) == "/user.slice/x"
    assert cgroup_path("0::/user.slice/x\n", v2=False) is None
    assert cgroup_path("", v2=True) is None


def test_ancestry_ends_at_the_root() -> None:
    assert ancestry("/a/b") == ["a/b", "a", ""]
    assert ancestry("/") == [""]
    assert ancestry("") == [""]
