"""Talking to workers: deliver an attempt, kill one, ask if a worker is alive.

Every call has a short timeout (the reference: one second for a delivery) so one slow worker
never stalls a scheduling round, and every call is idempotent by (batch, job, attempt) on the
worker's side (invariant 7), so the scheduler may repeat any of them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Sequence
from typing import Any, Self

import aiohttp
import msgspec

log = logging.getLogger(__name__)


class Delivery(enum.Enum):
    """What became of one delivery."""

    ACCEPTED = "accepted"
    """The worker runs (or ran) the attempt."""
    REFUSED = "refused"
    """The worker said no for good (no cores, shutting down, a bad request): a new attempt."""
    UNKNOWN = "unknown"
    """No answer in time: the worker may or may not have it; deliver again later."""


class Attempt(msgspec.Struct, frozen=True, kw_only=True):
    """The body of a delivery; the worker reads the spec from the spec store."""

    batch_id: int
    job_id: int
    attempt_id: str
    user: str
    cores_mcpu: int


class _Answer(msgspec.Struct, frozen=True):
    """A worker's answer to one attempt of a batch delivery."""

    status: int
    message: str | None = None


class WorkerClient:
    """HTTP to workers, with one connection pool; an async context manager."""

    def __init__(self, *, timeout_s: float, concurrency: int) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._limit = asyncio.Semaphore(concurrency)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(
            timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def deliver(self, address: str, attempt: Attempt) -> Delivery:
        """POST the attempt to the worker at ``address`` (host:port)."""
        status, body = await self._call("POST", f"http://{address}/api/v1alpha/jobs",
                                        msgspec.json.encode(attempt))
        if status == 200:
            return Delivery.ACCEPTED
        if status is None or (status >= 500 and status != 503):
            return Delivery.UNKNOWN
        log.warning("worker %s refused %s/%s/%s: %s %s", address, attempt.batch_id,
                    attempt.job_id, attempt.attempt_id, status, body)
        return Delivery.REFUSED

    async def deliver_many(self, address: str, attempts: Sequence[Attempt]) -> list[Delivery]:
        """Deliver several attempts to one worker in one request; one result per attempt.

        A worker that predates the batch endpoint (404) gets them one request each.
        """
        if len(attempts) == 1:
            return [await self.deliver(address, attempts[0])]
        status, body = await self._call("POST", f"http://{address}/api/v1alpha/attempts",
                                        msgspec.json.encode(attempts))
        if status == 404:
            return list(await asyncio.gather(*(self.deliver(address, a) for a in attempts)))
        if status != 200:
            if status is None or (status >= 500 and status != 503):
                return [Delivery.UNKNOWN] * len(attempts)
            log.warning("worker %s refused %d attempts: %s %s", address, len(attempts), status,
                        body)
            return [Delivery.REFUSED] * len(attempts)
        try:
            answers = msgspec.json.decode(body, type=list[_Answer])
        except msgspec.DecodeError:
            return [Delivery.UNKNOWN] * len(attempts)
        if len(answers) != len(attempts):
            return [Delivery.UNKNOWN] * len(attempts)
        out = []
        for attempt, answer in zip(attempts, answers, strict=True):
            if answer.status == 200:
                out.append(Delivery.ACCEPTED)
            elif answer.status >= 500 and answer.status != 503:
                out.append(Delivery.UNKNOWN)
            else:
                log.warning("worker %s refused %s/%s/%s: %s %s", address, attempt.batch_id,
                            attempt.job_id, attempt.attempt_id, answer.status, answer.message)
                out.append(Delivery.REFUSED)
        return out

    async def kill(self, address: str, batch_id: int, job_id: int, attempt_id: str) -> bool:
        """DELETE the attempt on its worker; True once the worker knows of the cancel."""
        status, _ = await self._call(
            "DELETE", f"http://{address}/api/v1alpha/jobs/{batch_id}/{job_id}/{attempt_id}")
        return status in (200, 404)

    async def alive(self, address: str) -> bool:
        """Whether the worker answers its health check."""
        status, _ = await self._call("GET", f"http://{address}/healthcheck")
        return status == 200

    async def _call(self, method: str, url: str, data: bytes | None = None
                    ) -> tuple[int | None, Any]:
        assert self._session is not None, "the worker client is not started"
        async with self._limit:
            try:
                async with self._session.request(
                        method, url, data=data,
                        headers={"Content-Type": "application/json"}) as resp:
                    return resp.status, await resp.read()
            except (TimeoutError, aiohttp.ClientError) as e:
                log.debug("%s %s: %s", method, url, e)
                return None, None
