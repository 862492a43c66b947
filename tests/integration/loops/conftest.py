"""The tests here run on both event loops: asyncio's and uvloop's.

The services run on uvloop (``services.common.eventloop``); tests elsewhere run on asyncio's.
These drive what differs between the two most (child processes, pidfd readers, pipes, signals,
timers, the worker's HTTP server), so each async test runs once on each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from services.worker.spawner import Spawner


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> dict[str, object]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(autouse=True)
def _spawners_closed() -> Iterator[None]:
    """Each test's job-process spawners end with it (services/worker/spawner): its loop does."""
    yield
    Spawner.close_all()
