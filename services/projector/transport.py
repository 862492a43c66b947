"""faust's aiokafka transport, with the consumer's fetch wait taken from our settings.

faust-streaming 0.15.3 creates its worker consumer with ``fetch_max_wait_ms=1500`` and no
setting to change it. Against Kafka that costs nothing: the broker answers a waiting fetch as
soon as records arrive. The local broker (tansu) does not: it answers when the wait is over, so
every event reached the projector up to 1.5 s late, and so did every read-your-writes answer
that waited for it. The projector sets ``LogSettings.fetch_max_wait_ms`` here instead.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka reads this attribute when the consumer starts (it is not started yet).
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise RuntimeError("aiokafka's consumer no longer has _fetch_max_wait_ms: "
                               "revisit services/projector/transport.py")
        consumer._fetch_max_wait_ms = self.app.conf.hs_fetch_max_wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with :class:`_Consumer`."""

    Consumer = _Consumer


def use_transport(app: faust.App, fetch_max_wait_ms: int) -> None:
    """Make ``app`` consume through :class:`Transport` with this fetch wait (call before the
    app first touches its transport)."""
    app.conf.hs_fetch_max_wait_ms = fetch_max_wait_ms
    app.transport = Transport(app.conf.broker_consumer, app)
