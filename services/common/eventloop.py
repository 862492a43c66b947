"""The services' event loop: uvloop's (libuv) unless ``HS_EVENT_LOOP=asyncio`` asks for asyncio's.

Every service is one event loop carrying many small callbacks per job (a worker: the dispatch
request, the attempt's task, its pidfd's reader, its MJS timer, the outbox's publish; ingest and
the scheduler: HTTP and the broker's fetches). uvloop runs the same asyncio code with the loop
itself in C. The code does not depend on it: tests run on asyncio's loop, and
``HS_EVENT_LOOP=asyncio`` runs a service on it too (for a comparison, or a platform uvloop does
not support).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]

LOOP_ENV = "HS_EVENT_LOOP"
"""``uvloop`` (the default) or ``asyncio``."""

LOOPS = ("uvloop", "asyncio")


def loop_name(env: Mapping[str, str] | None = None) -> str:
    """The loop ``env`` asks for; ValueError naming the choices for anything else."""
    name = (os.environ if env is None else env).get(LOOP_ENV, "").strip().lower() or LOOPS[0]
    if name not in LOOPS:
        raise ValueError(f"{LOOP_ENV}={name!r}: expected one of {', '.join(LOOPS)}")
    return name


def loop_factory(env: Mapping[str, str] | None = None) -> LoopFactory | None:
    """What makes the service's loop (None: asyncio's default)."""
    if loop_name(env) == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def service_loop(service: str, env: Mapping[str, str] | None = None) -> LoopFactory | None:
    """A service's first step: :func:`loop_factory`, or exit saying what is wrong."""
    try:
        return loop_factory(env)
    except ValueError as e:
        raise SystemExit(f"{service}: {e}") from None


def new_event_loop(factory: LoopFactory | None) -> asyncio.AbstractEventLoop:
    """A loop from ``factory`` (for code that runs its own, like faust's worker)."""
    return factory() if factory is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], factory: LoopFactory | None) -> T:
    """``asyncio.run(main)`` on a loop from ``factory`` (None: asyncio's)."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (if not done) and wait for it to end; raise its error if it failed.

    The usual ``task.cancel()`` then ``with suppress(CancelledError): await task`` also
    swallows a cancellation of the *caller* that arrives while it waits: the caller carries on
    as if it had never been cancelled, and whatever waits for it to end waits forever (aiokafka's
    client close does just that: ``services.common.log.stop_client``). Here a CancelledError is
    swallowed only when the caller has no cancellation of its own pending.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise
