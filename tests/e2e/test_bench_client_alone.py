"""The bench's client ceiling: the official client against the null server, in bunches."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ingest_throughput import HAIL_PYTHON, client_alone


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
