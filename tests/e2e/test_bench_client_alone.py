"""The bench's client ceiling: the official client against the null server, in bunches."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ingest_throughput import CLIENT_PACKAGES, HAIL_PYTHON, client_alone, client_versions


def test_the_official_client_submits_several_bunches_to_the_null_server(tmp_path: Path) -> None:
    if not HAIL_PYTHON.exists():
        pytest.fail("the official client is not installed: run `make venv-hail`")
    # 2,500 jobs: three bunches of at most 1,024, so the client opens, posts, then commits.
    out = client_alone(2_500, tmp_path)
    assert out["id"] == 1
    assert out["cpu_seconds"] > 0
    assert 0 < out["seconds"] < 60
    # The batch was created (the client's first request) after submit() was called and
    # before it returned.
    assert out["started_at"] <= out["created_at"] <= out["started_at"] + out["seconds"]
    assert "Error" not in (tmp_path / "null-server.log").read_text()


def test_the_bench_records_the_client_s_versions_as_hail_pins_them() -> None:
    if not HAIL_PYTHON.exists():
        pytest.fail("the official client is not installed: run `make venv-hail`")
    versions = client_versions()
    assert set(versions) == set(CLIENT_PACKAGES)
    assert versions["hail"] == "0.2.139"
    # make venv-hail installs the versions the release pins for itself (its deploy.yaml)
    pins = (HAIL_PYTHON.parent.parent / "hail-pins.txt").read_text().split()
    assert f"orjson=={versions['orjson']}" in pins
    assert f"aiohttp=={versions['aiohttp']}" in pins
