"""The tests here run on both event loops: asyncio's and uvloop's.

The services run on uvloop (``services.common.eventloop``); tests elsewhere run on asyncio's.
These drive what differs between the two most (child processes, pidfd readers, pipes, signals,
timers, the worker's HTTP server), so each async test runs once on each.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> dict[str, object]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
