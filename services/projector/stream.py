"""faust's stream, with ``take_events`` asleep while nothing arrives.

faust-streaming 0.15.3's ``Stream.take_events(n, within)`` waits for a full buffer at most
``within`` at a time, in a loop, whether or not anything came: the projector's agent woke
every 10 ms (its ``BATCH_WITHIN_S``) with nothing to take, and each wake is a round of mode's
``wait_for_stopped`` (futures made, waited on, cancelled). The idle projector's event loop spent
about 80 ms of CPU a second, 45 of them on those wakes (measured with the whole stack idle:
the loop's thread 82 ms/s at a 10 ms wait, 38 at 100 ms), and between the fetches of a busy
run most wakes find nothing too.

:class:`QuietStream` notes each event as it arrives (a processor of its own). When
``take_events`` asks to wait with a timeout and nothing has arrived since its last wait
returned, the stream first waits for an event without a timeout, then gives the buffer its
``within`` to fill, counted from that first event (before, from the last wake: 0 to ``within``
after it). A batch still waits at most ``within``
after its first event; an idle agent sleeps until one comes or the stream stops.

This leans on how ``take_events`` is written (one ``wait_for_stopped(buffer_full,
timeout=within)`` a turn; its own processor fills the buffer as events arrive), as faust is
pinned: ``tests/integration/test_projector_stream.py`` makes those calls as it does, and the
projector's suites run it under ``take_events`` against the real broker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust


class QuietStream(faust.Stream):  # type: ignore[type-arg]  # faust's Stream is generic
    """See the module docstring. Set as the app's ``Stream`` (``faust.App(Stream=...)``)."""

    _arrived: asyncio.Event | None = None

    def _note_arrival(self, value: Any) -> Any:
        assert self._arrived is not None
        self._arrived.set()
        return value

    async def wait_for_stopped(self, *coros: Any,
                               timeout: Any = None) -> bool:  # noqa: ASYNC109 (mode's)
        """As mode's, except a wait with a timeout waits first, without one, for an event to
        arrive if none has since the last such wait returned."""
        if timeout is None:
            return await super().wait_for_stopped(*coros)
        if self._arrived is None:  # take_events' first wait: its buffer's processor is in
            self._arrived = asyncio.Event()
            self.add_processor(self._note_arrival)
        # mode types the waitable as its own Event; anything with an awaitable wait() works.
        if not self._arrived.is_set() and await super().wait_for_stopped(
                self._arrived):  # type: ignore[arg-type]
            return True  # stopped
        stopped = await super().wait_for_stopped(*coros, timeout=timeout)
        # take_events hands out its buffer now, with no wait in between: what arrived so far
        # is in it, and what arrives from here on is the next batch's.
        self._arrived.clear()
        return stopped
