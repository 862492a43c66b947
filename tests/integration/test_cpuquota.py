"""The bench's CPU quota (bench.cpuquota): a cgroup made, the processes moved in and back, the
cgroup removed; on a fake cgroup tree for both layouts, and on this machine's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cpuquota import (
    Hierarchy,
    QuotaError,
    cpu_quota,
    find_hierarchy,
    server_pids,
)


def _proc(tmp: Path, pid: int, comm: str, cgroup: str) -> None:
    (tmp / "proc" / str(pid)).mkdir(parents=True)
    (tmp / "proc" / str(pid) / "comm").write_text(comm + "\n")
    (tmp / "proc" / str(pid) / "cgroup").write_text(cgroup)


def test_v1_limits_and_moves_on_a_fake_tree(tmp_path: Path) -> None:
    cpu = tmp_path / "cg" / "cpu"
    (cpu / "work").mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    me = os.getpid()
    _proc(tmp_path, me, "python", "4:memory:/x\n1:cpu:/work\n0::/\n")
    _proc(tmp_path, 77, "mariadbd", "1:cpu:/\n")
    _proc(tmp_path, 78, "bash", "1:cpu:/\n")
    assert server_pids(tmp_path / "proc") == [77]
    with cpu_quota(0.8, root=tmp_path / "cg", proc=tmp_path / "proc") as group:
        assert group == cpu / "work" / f"hs-bench-quota-{me}"
        assert (group / "cpu.cfs_period_us").read_text() == "10000\n"
        assert (group / "cpu.cfs_quota_us").read_text() == "8000\n"
        assert (group / "cgroup.procs").read_text() == f"{me}\n"  # the last one moved in
    # Each went back where it came from: the server to the root, this process to its own.
    assert (cpu / "cgroup.procs").read_text() == "77\n"
    assert (cpu / "work" / "cgroup.procs").read_text() == f"{me}\n"


def test_v2_writes_cpu_max(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    me = os.getpid()
    _proc(tmp_path, me, "python", "0::/\n")
    assert find_hierarchy(tmp_path / "cg") == Hierarchy(tmp_path / "cg", v2=True)
    with cpu_quota(1.5, pids=[me], root=tmp_path / "cg", proc=tmp_path / "proc") as group:
        assert (group / "cpu.max").read_text() == "15000 10000\n"


def test_refused_where_it_cannot_be(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    with pytest.raises(QuotaError, match="no cgroup hierarchy with the CPU controller"):
        find_hierarchy(tmp_path / "cg")
    with pytest.raises(QuotaError, match="expected more than 0"), cpu_quota(0):
        pass
    with pytest.raises(QuotaError, match="at most the machine's"), cpu_quota(1_000):
        pass


def _writable() -> bool:
    try:
        hierarchy = find_hierarchy()
    except QuotaError:
        return False
    return os.access(hierarchy.group_of(os.getpid()), os.W_OK)


@pytest.mark.skipif(not _writable(), reason="this machine's cgroups cannot be written here")
def test_a_real_quota_throttles_and_is_removed() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    hierarchy = find_hierarchy()
    home = hierarchy.group_of(spin.pid)
    try:
        with cpu_quota(0.2, pids=[spin.pid]) as group:
            assert hierarchy.group_of(spin.pid) == group
            time.sleep(0.5)
            stat = dict(line.split()[:2] for line in (group / "cpu.stat").read_text().splitlines())
            assert int(stat["nr_throttled"]) > 0  # held to its fifth of a core
        assert hierarchy.group_of(spin.pid) == home
        assert not group.exists()
    finally:
        spin.kill()
        spin.wait()
