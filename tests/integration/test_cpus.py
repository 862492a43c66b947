"""The CPU this process may use, read from /proc and the cgroup file system
(services.common.cpus): on fake trees of both layouts, and under a real quota."""

from __future__ import annotations

import os
from pathlib import Path

from bench.cpuquota import cpu_quota
from services.common.cpus import usable_cores, usable_cpus


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def test_v2_quotas_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "pods" / "a").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (root / "pods" / "cpu.max").write_text("max 100000\n")
    (root / "pods" / "a" / "cpu.max").write_text("50000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/pods/a\n")
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc) == min(0.5, _cores())
    assert usable_cores(cgroup_root=root, proc_cgroup=proc) == 1
    (root / "pods" / "a" / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc) == _cores()
    (root / "cpu.max").write_text("garbled\n")  # unreadable: no quota, not an error
    assert usable_cpus(cgroup_root=root, proc_cgroup=proc) == _cores()


def test_v1_quota_of_an_ancestor(tmp_path: Path) -> None:
    cpu = tmp_path / "cg" / "cpu,cpuacct"
    (cpu / "pods" / "a").mkdir(parents=True)
    for d, quota in ((cpu, "-1"), (cpu / "pods", "25000"), (cpu / "pods" / "a", "-1")):
        (d / "cpu.cfs_quota_us").write_text(quota + "\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu,cpuacct:/pods/a\n0::/\n")
    assert usable_cpus(cgroup_root=tmp_path / "cg", proc_cgroup=proc) == min(0.25, _cores())


def test_without_cgroups_the_affinity(tmp_path: Path) -> None:
    assert usable_cpus(cgroup_root=tmp_path / "none", proc_cgroup=tmp_path / "none") == _cores()


def test_under_a_real_quota() -> None:
    before = usable_cpus()
    with cpu_quota(1.5, pids=[os.getpid()]):
        assert usable_cpus() == min(1.5, before)
    assert usable_cpus() == before


def test_a_worker_offers_the_cores_it_may_use() -> None:
    from services.worker.__main__ import load_worker_settings

    assert load_worker_settings({}).cores_mcpu == 1000 * usable_cores()
    with cpu_quota(0.5, pids=[os.getpid()]):
        assert load_worker_settings({}).cores_mcpu == 1000  # half a core: one job's core
        assert load_worker_settings({"HS_WORKER_CORES_MCPU": "4000"}).cores_mcpu == 4000


def test_a_rebuild_under_a_quota_runs_a_lane_per_core_it_may_use() -> None:
    import subprocess
    import sys

    probe = [sys.executable, "-c",
             "import services.audit.cli as c; print(c.BULK_LANES, c.SINK_LANES)"]
    with cpu_quota(1.0, pids=[os.getpid()]):  # the child starts inside, as a container's would
        held = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.split()
    assert held == ["1", "2"]


def test_the_replay_bench_replays_as_a_rebuild_under_its_quota() -> None:
    from bench.replay import modes_now

    with cpu_quota(1.0, pids=[os.getpid()]):
        assert modes_now() == ((1, True), (2, False))  # one bulk lane, and twice that through
