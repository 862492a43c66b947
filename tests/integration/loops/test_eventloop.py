"""The services' event loop: uvloop unless HS_EVENT_LOOP=asyncio, a clear error otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from services.common import eventloop

pytestmark = pytest.mark.integration


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


@pytest.mark.parametrize(("env", "name"), [
    ({}, "uvloop"), ({"HS_EVENT_LOOP": ""}, "uvloop"), ({"HS_EVENT_LOOP": " UVLoop "}, "uvloop"),
    ({"HS_EVENT_LOOP": "asyncio"}, "asyncio"),
])
def test_the_loop_a_setting_asks_for(env: dict[str, str], name: str) -> None:
    assert eventloop.loop_name(env) == name


def test_a_service_runs_on_uvloop_by_default() -> None:
    factory = eventloop.service_loop("svc", {})
    assert issubclass(eventloop.run(_loop_type(), factory), uvloop.Loop)
    loop = eventloop.new_event_loop(factory)
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_asyncio_asks_for_asyncios_own_loop() -> None:
    factory = eventloop.service_loop("svc", {"HS_EVENT_LOOP": "asyncio"})
    assert factory is None
    kind = eventloop.run(_loop_type(), factory)
    assert not issubclass(kind, uvloop.Loop)
    assert issubclass(kind, asyncio.BaseEventLoop)


def test_an_unknown_loop_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"HS_EVENT_LOOP='trio': expected one of uvloop, asyncio"):
        eventloop.loop_factory({"HS_EVENT_LOOP": "trio"})
    with pytest.raises(SystemExit, match=r"^svc: HS_EVENT_LOOP='trio': expected one of"):
        eventloop.service_loop("svc", {"HS_EVENT_LOOP": "trio"})


@pytest.mark.parametrize("service", ["worker", "scheduler", "ingest", "completions", "projector"])
def test_a_service_started_with_an_unknown_loop_exits_saying_why(service: str) -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", f"services.{service}"],
                          env={"HS_EVENT_LOOP": "trio", "PATH": "/usr/bin:/bin",
                               "HS_DATA_DIR": "/nonexistent-hs-data"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"{service}: HS_EVENT_LOOP='trio': expected one of uvloop, asyncio" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_this_module_runs_on_both_loops(request: pytest.FixtureRequest) -> None:
    """The conftest's hook: this test exists once per loop, each on its own."""
    kind = type(asyncio.get_running_loop())
    assert issubclass(kind, uvloop.Loop) == request.node.callspec.id.endswith("uvloop")
