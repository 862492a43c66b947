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


async def _slow_to_end(ended: asyncio.Event) -> None:
    """A task that takes a few turns to end once cancelled (a close, say)."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        for _ in range(5):
            await asyncio.sleep(0)
        ended.set()
        raise


async def test_cancel_and_wait_ends_a_task_and_carries_on() -> None:
    ended = asyncio.Event()
    task = asyncio.create_task(_slow_to_end(ended))
    await asyncio.sleep(0)
    await eventloop.cancel_and_wait(task)
    assert ended.is_set() and task.cancelled()
    await eventloop.cancel_and_wait(task)  # done already: nothing to do


async def test_cancel_and_wait_raises_the_tasks_own_error() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("closing failed") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="closing failed"):
        await eventloop.cancel_and_wait(task)


@pytest.mark.parametrize("turns", range(1, 7))
async def test_a_caller_cancelled_while_it_waits_ends_cancelled(turns: int) -> None:
    """The pattern it replaces (``suppress(CancelledError)`` around the await) let the caller
    go on to its next step: here it ends, whichever turn of the task's ending the cancel hits."""
    task = asyncio.create_task(_slow_to_end(asyncio.Event()))
    await asyncio.sleep(0)
    went_on = asyncio.Event()

    async def caller() -> None:
        await eventloop.cancel_and_wait(task)
        went_on.set()
        await asyncio.sleep(3600)

    outer = asyncio.create_task(caller())
    for _ in range(turns):
        await asyncio.sleep(0)
    assert not task.done()  # still ending: the cancel below hits the wait
    outer.cancel()
    done, _ = await asyncio.wait({outer}, timeout=5)
    assert done and outer.cancelled()
    assert task.done() and not went_on.is_set()
