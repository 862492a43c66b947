"""The scheduler's settings: identity, driver, pool sizes and loop timings (``HS_SCHEDULER_*``).

| variable | default | meaning |
|---|---|---|
| ``HS_SCHEDULER_ID`` | host name + pid | this replica's name in ``scheduler.elected`` |
| ``HS_SCHEDULER_DRIVER`` | ``local`` | the compute driver (``local``, ``gcp``, ``azure``) |
| ``HS_SCHEDULER_WORKER_CORES`` | 16 | cores of every pool worker |
| ``HS_SCHEDULER_MAX_INSTANCES`` | 2 | instances per pool (and job-private instances) |
| ``HS_SCHEDULER_MAX_NEW_PER_ROUND`` | 2 | instances created per pool per autoscaler round |
| ``HS_SCHEDULER_AUTOSCALE_S`` | 2 | seconds between autoscaler rounds (the reference: 15) |
| ``HS_SCHEDULER_IDLE_S`` | 30 | an instance running nothing this long is deleted |
| ``HS_SCHEDULER_ACTIVATION_S`` | 120 | an instance not active this long after its request goes |
| ``HS_SCHEDULER_DISPATCH_TIMEOUT_S`` | 1 | the short timeout on delivering an attempt |
| ``HS_SCHEDULER_REDELIVER_S`` | 10 | an SJ not started this long is delivered again |
| ``HS_SCHEDULER_LEASE`` | ``hailstream-scheduler`` | the database lock the replicas contend for |
| ``HS_SCHEDULER_WORKER_HEARTBEAT_S`` | 60 | passed to local workers (billing heartbeats) |
| ``HS_SCHEDULER_WORKER_LINGER_MS`` | none | passed to local workers: their MJS/MJC linger |
| ``HS_SCHEDULER_POLICY`` | ``fair-share`` | or ``priority``: JAliEn priorities first |
| ``HS_SCHEDULER_QUOTAS`` | none | JSON quotas per user for ``priority`` |
| ``HS_SCHEDULER_BUDGET_S`` | 5 | seconds between billing-limit checks |
| ``HS_SCHEDULER_WAITING_S`` | 1 | seconds between waiting-reason events (changes only) |
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import msgspec

from services.common.settings import pick_env


class SchedulerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduler replica."""

    scheduler_id: str
    driver: str = "local"
    worker_cores: int = 16
    max_instances: int = 2
    max_new_per_round: int = 2
    autoscale_s: float = 2.0
    # The reference's autoscaler looks 2.5 minutes ahead: a user's window is its share of the
    # jobs the scheduler could start in that time.
    window_s: float = 150.0
    idle_s: float = 30.0
    activation_s: float = 120.0
    health_s: float = 5.0
    health_failures: int = 3
    dispatch_timeout_s: float = 1.0
    dispatch_concurrency: int = 64
    redeliver_s: float = 10.0
    kill_repeat_s: float = 5.0
    max_jobs_per_step: int = 2_000
    idle_loop_s: float = 0.5
    lease: str = "hailstream-scheduler"
    lease_check_s: float = 1.0
    worker_heartbeat_s: float = 60.0
    worker_linger_ms: int | None = None
    policy: str = "fair-share"
    quotas: str = ""
    priority_s: float = 5.0
    cost_per_core_s: int = 1
    budget_s: float = 5.0
    waiting_s: float = 1.0
    """At most one ``scheduler.waiting_reasons`` event per this many seconds."""


_ENV = {
    "HS_SCHEDULER_ID": ("scheduler_id", str),
    "HS_SCHEDULER_DRIVER": ("driver", str),
    "HS_SCHEDULER_BUDGET_S": ("budget_s", float),
    "HS_SCHEDULER_WAITING_S": ("waiting_s", float),
    "HS_SCHEDULER_WORKER_CORES": ("worker_cores", int),
    "HS_SCHEDULER_MAX_INSTANCES": ("max_instances", int),
    "HS_SCHEDULER_MAX_NEW_PER_ROUND": ("max_new_per_round", int),
    "HS_SCHEDULER_AUTOSCALE_S": ("autoscale_s", float),
    "HS_SCHEDULER_IDLE_S": ("idle_s", float),
    "HS_SCHEDULER_ACTIVATION_S": ("activation_s", float),
    "HS_SCHEDULER_DISPATCH_TIMEOUT_S": ("dispatch_timeout_s", float),
    "HS_SCHEDULER_REDELIVER_S": ("redeliver_s", float),
    "HS_SCHEDULER_LEASE": ("lease", str),
    "HS_SCHEDULER_WORKER_HEARTBEAT_S": ("worker_heartbeat_s", float),
    "HS_SCHEDULER_WORKER_LINGER_MS": ("worker_linger_ms", int),
    "HS_SCHEDULER_POLICY": ("policy", str),
    "HS_SCHEDULER_QUOTAS": ("quotas", str),
}

POLICIES = ("fair-share", "priority")


def load_scheduler_settings(env: Mapping[str, str] | None = None) -> SchedulerSettings:
    """The scheduler's settings from ``HS_SCHEDULER_*`` in ``env`` (default: the environment)."""
    env = os.environ if env is None else env
    fields = pick_env(env, _ENV)
    fields.setdefault("scheduler_id", f"{socket.gethostname()}-{os.getpid()}")
    if fields.get("policy", POLICIES[0]) not in POLICIES:
        raise ValueError(f"HS_SCHEDULER_POLICY: {fields['policy']!r} is not one of "
                         f"{', '.join(POLICIES)}")
    return SchedulerSettings(**fields)  # type: ignore[arg-type]
