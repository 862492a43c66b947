"""The worker-alone bench runs attempts through a real worker and its spawner and counts the CPU
of each part a job."""

from __future__ import annotations

import os

import pytest

from bench.worker_alone import measure
from services.worker.spawner import helper_path

pytestmark = pytest.mark.integration


async def test_the_worker_alone_counts_its_python_its_spawner_and_the_jobs() -> None:
    figures = await measure(300)
    assert figures["worker_python_us"] > 0 and figures["jobs_per_s"] > 0
    if helper_path() is None:
        assert "spawner_us" not in figures and "children_us" not in figures
        return
    # Every job exec'd `true`: 300 starts cost more than two of the clock's ticks.
    assert figures["children_us"] > 2 * 1e6 / os.sysconf("SC_CLK_TCK") / 300
    assert figures["spawner_us"] >= 0


async def test_without_the_spawner_the_worker_starts_the_jobs_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HS_WORKER_SPAWNER", "off")
    figures = await measure(100)
    assert set(figures) == {"worker_python_us", "jobs_per_s"}
