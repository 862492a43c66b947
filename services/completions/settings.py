"""The completions service's settings (``HS_COMPLETIONS_*``), beside the shared ``HS_*`` ones.

| variable | default | meaning |
|---|---|---|
| ``HS_COMPLETIONS_POLL_S`` | 0.2 | how often the outbox relay looks for new outbox rows |
| ``HS_COMPLETIONS_IDLE_S`` | 5 | the callback sender's longest sleep with nothing due |
| ``HS_COMPLETIONS_BATCH`` | 500 | outbox rows published per round |
| ``HS_COMPLETIONS_CALLBACKS`` | true | deliver HTTP callbacks (false: only publish completions) |
| ``HS_COMPLETIONS_MAX_ATTEMPTS`` | 12 | attempts per callback before it is marked failed |
| ``HS_COMPLETIONS_BACKOFF_BASE_S`` | 1 | the backoff ceiling after the first failed attempt |
| ``HS_COMPLETIONS_BACKOFF_MAX_S`` | 300 | the largest backoff ceiling |
| ``HS_COMPLETIONS_HTTP_TIMEOUT_S`` | 10 | the whole time one callback POST may take |
| ``HS_COMPLETIONS_CONCURRENCY`` | 32 | callbacks in flight at once |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from services.common.settings import LogSettings, parse_bool, pick_env

CALLBACK_CONSUMER = "completions-callbacks"
"""The callback intake's consumer name in ``applied_offsets`` (before the topic prefix)."""


class CompletionsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One completions service."""

    poll_s: float = 0.2
    # The callback sender sleeps until the earliest pending delivery is due (a retry, a claim
    # that expires) or the intake wakes it, and at most this long. It polled every poll_s
    # before: with nothing to send, half the idle service's CPU.
    idle_s: float = 5.0
    batch_size: int = 500
    callbacks: bool = True
    max_attempts: int = 12
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    http_timeout_s: float = 10.0
    concurrency: int = 32
    # A claimed delivery whose attempt never reported (the process died mid-POST) is due again
    # this long after the POST's own timeout.
    claim_margin_s: float = 5.0
    # How long a loop waits after the log or the database failed, at most.
    retry_max_s: float = 10.0
    # The callback intake's fetch wait (at least the log's). The local broker answers a fetch
    # only when its wait is over, so an idle consumer polls it every wait: at the stack's 25 ms
    # the intake alone cost ~35 ms of CPU per second doing nothing (plus the broker's share).
    # Callbacks are not that urgent; on Kafka a longer wait costs no latency at all.
    intake_fetch_wait_ms: int = 250

    @property
    def claim_ms(self) -> int:
        return int((self.http_timeout_s + self.claim_margin_s) * 1000)


_ENV = {
    "HS_COMPLETIONS_POLL_S": ("poll_s", float),
    "HS_COMPLETIONS_IDLE_S": ("idle_s", float),
    "HS_COMPLETIONS_BATCH": ("batch_size", int),
    "HS_COMPLETIONS_CALLBACKS": ("callbacks", parse_bool),
    "HS_COMPLETIONS_MAX_ATTEMPTS": ("max_attempts", int),
    "HS_COMPLETIONS_BACKOFF_BASE_S": ("backoff_base_s", float),
    "HS_COMPLETIONS_BACKOFF_MAX_S": ("backoff_max_s", float),
    "HS_COMPLETIONS_HTTP_TIMEOUT_S": ("http_timeout_s", float),
    "HS_COMPLETIONS_CONCURRENCY": ("concurrency", int),
    "HS_COMPLETIONS_FETCH_WAIT_MS": ("intake_fetch_wait_ms", int),
}


def load_completions_settings(env: Mapping[str, str] | None = None) -> CompletionsSettings:
    """The service's settings from ``HS_COMPLETIONS_*`` in ``env`` (default: the environment)."""
    env = os.environ if env is None else env
    fields = pick_env(env, _ENV)
    settings = CompletionsSettings(**fields)  # type: ignore[arg-type]
    if settings.max_attempts < 1:
        raise ValueError("HS_COMPLETIONS_MAX_ATTEMPTS must be at least 1")
    if settings.backoff_base_s <= 0 or settings.backoff_max_s < settings.backoff_base_s:
        raise ValueError("HS_COMPLETIONS_BACKOFF_*: need 0 < base <= max")
    if settings.poll_s <= 0 or settings.idle_s <= 0:
        raise ValueError("HS_COMPLETIONS_POLL_S and HS_COMPLETIONS_IDLE_S must be positive")
    if not 0 <= settings.intake_fetch_wait_ms <= 5_000:
        raise ValueError("HS_COMPLETIONS_FETCH_WAIT_MS must be between 0 and 5000")
    return settings


def callback_consumer(log: LogSettings) -> str:
    """The callback intake's consumer name as stored in ``applied_offsets``."""
    return f"{log.topic_prefix}{CALLBACK_CONSUMER}"
