"""The pure side of completions: outcome, outbox rows, keys, events, backoff, payloads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.completions import (
    OUTBOX,
    Completion,
    after_attempt,
    as_of_completion,
    backoff_ms,
    completion_of,
    completion_ops,
    event_id,
    event_of,
    idempotency_key,
    outcome,
    parse_time,
    sender_wait_s,
)
from core.projection.ops import InsertIgnore
from core.status import format_time_ms, group_state
from schemas import codec
from schemas.batch import BatchCompleted, JobGroupCompleted
from schemas.envelope import wrap
from services.completions.settings import load_completions_settings

T0 = 1_767_225_600_000

counts = st.integers(0, 10_000)
completions = st.builds(
    Completion, batch_id=st.integers(1, 2**53), job_group_id=st.integers(0, 10_000),
    n_jobs=counts, outcome=st.sampled_from(["success", "failure", "cancelled"]),
    n_succeeded=counts, n_failed=counts, n_cancelled=counts,
    time_completed_ms=st.integers(0, 2**42))


@pytest.mark.parametrize(("n_failed", "cancelled", "expected"), [
    (0, False, "success"), (0, True, "cancelled"), (1, False, "failure"), (3, True, "failure"),
], ids=["success", "cancelled", "failure", "failure-outranks-cancel"])
def test_outcome(n_failed: int, cancelled: bool, expected: str) -> None:
    assert outcome(n_failed=n_failed, cancelled=cancelled) == expected


@given(st.integers(0, 100), st.booleans())
def test_outcome_is_the_state_reads_show_for_a_complete_group(n_failed: int,
                                                             cancelled: bool) -> None:
    assert outcome(n_failed=n_failed, cancelled=cancelled) == group_state(
        n_failed=n_failed, cancelled=cancelled, complete=True)


def test_completion_ops_one_idempotent_insert_with_counts_as_of_now() -> None:
    ops = completion_ops(7, [(2, 3, 0, 0, 3), (0, 5, 4, 1, 0)], frozenset({2}), T0)
    assert ops == [InsertIgnore(OUTBOX, [
        {"batch_id": 7, "job_group_id": 0, "n_jobs": 5, "outcome": "failure", "n_succeeded": 4,
         "n_failed": 1, "n_cancelled": 0, "time_completed_ms": T0},
        {"batch_id": 7, "job_group_id": 2, "n_jobs": 3, "outcome": "cancelled",
         "n_succeeded": 0, "n_failed": 0, "n_cancelled": 3, "time_completed_ms": T0},
    ])]
    assert completion_ops(7, [], frozenset(), T0) == []


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10**6)), unique=True, max_size=20))
def test_idempotency_keys_name_one_completion_each(triples: list[tuple[int, int]]) -> None:
    keys = {idempotency_key(9, g, n) for g, n in triples}
    assert len(keys) == len(triples)
    assert all(idempotency_key(9, g, n) == idempotency_key(9, g, n) for g, n in triples)


def test_idempotency_key_shape() -> None:
    assert idempotency_key(12, 0, 3) == "completion-12-0-3"
    assert Completion(12, 0, 3, "success", 3, 0, 0, T0).key == "completion-12-0-3"


@given(completions)
def test_event_round_trips_through_the_envelope_codec(c: Completion) -> None:
    event = event_of(c)
    assert isinstance(event, BatchCompleted if c.job_group_id == 0 else JobGroupCompleted)
    env = wrap(event, event_id=event_id(c), time_ms=T0)
    decoded = codec.decode(codec.encode(env)).event
    assert isinstance(decoded, BatchCompleted | JobGroupCompleted)
    assert completion_of(decoded) == c
    assert env.key == str(c.batch_id)


@given(completions, completions)
def test_event_ids_are_deterministic_per_completion(a: Completion, b: Completion) -> None:
    assert event_id(a) == event_id(a) and len(event_id(a)) == 32
    assert (event_id(a) == event_id(b)) == (a.key == b.key)


@given(st.integers(1, 10_000), st.integers(1, 10**6), st.integers(1, 10**8),
       st.floats(0, 1, exclude_max=True))
def test_backoff_stays_in_the_upper_half_of_a_capped_doubling_ceiling(
        attempt: int, base: int, cap: int, jitter: float) -> None:
    ceiling = min(cap, base * 2 ** min(attempt - 1, 64))
    delay = backoff_ms(attempt, base_ms=base, cap_ms=cap, jitter=jitter)
    assert ceiling // 2 <= delay <= ceiling


@given(st.integers(1, 60), st.floats(0, 1, exclude_max=True))
def test_backoff_grows_until_the_cap(attempt: int, jitter: float) -> None:
    kw: dict[str, Any] = {"base_ms": 1_000, "cap_ms": 300_000, "jitter": jitter}
    lo = backoff_ms(attempt, **kw)
    hi = backoff_ms(attempt + 1, **kw)
    assert hi >= lo or hi >= 150_000  # once capped, only the jitter moves it


@pytest.mark.parametrize(("attempt", "jitter", "expected"), [
    (1, 0.0, 500), (1, 0.999999, 999), (2, 0.0, 1_000), (3, 0.5, 3_000), (20, 0.0, 5_000),
], ids=["first-low", "first-high", "second", "third-mid", "capped"])
def test_backoff_examples(attempt: int, jitter: float, expected: int) -> None:
    assert backoff_ms(attempt, base_ms=1_000, cap_ms=10_000, jitter=jitter) == expected


@pytest.mark.parametrize(("attempt", "jitter"), [(0, 0.5), (1, 1.0), (1, -0.1)],
                         ids=["attempt-0", "jitter-1", "jitter-negative"])
def test_backoff_rejects_bad_arguments(attempt: int, jitter: float) -> None:
    with pytest.raises(ValueError):
        backoff_ms(attempt, base_ms=1, cap_ms=10, jitter=jitter)


@given(st.integers(1, 30), st.floats(0, 1, exclude_max=True))
def test_a_failing_receiver_gets_exactly_max_attempts(max_attempts: int, jitter: float) -> None:
    now = T0
    for attempt in range(1, max_attempts + 1):
        after = after_attempt(ok=False, attempts=attempt, max_attempts=max_attempts, now_ms=now,
                              base_ms=100, cap_ms=10_000, jitter=jitter)
        if attempt < max_attempts:
            assert after.status == "pending" and after.next_attempt_ms is not None
            assert now + 50 <= after.next_attempt_ms <= now + 10_000
            now = after.next_attempt_ms
        else:
            assert after.status == "failed" and after.next_attempt_ms is None


def test_a_2xx_delivers_whatever_the_attempt() -> None:
    after = after_attempt(ok=True, attempts=99, max_attempts=3, now_ms=T0, base_ms=1,
                          cap_ms=1, jitter=0.0)
    assert after.status == "delivered" and after.next_attempt_ms is None


def _batch_status(**over: Any) -> dict[str, Any]:
    return {"id": 7, "user": "alice", "billing_project": "p", "token": "t", "state": "running",
            "complete": False, "closed": True, "n_jobs": 9, "n_completed": 4, "n_succeeded": 4,
            "n_failed": 0, "n_cancelled": 0, "time_created": format_time_ms(T0),
            "time_closed": format_time_ms(T0), "time_completed": None, "duration_ms": None,
            "duration": None, "msec_mcpu": 0, "cost": 0.5, "cost_breakdown": [],
            "attributes": {"name": "x"}} | over


def test_payload_says_what_the_completion_decided_even_if_the_batch_moved_on() -> None:
    live = _batch_status()  # an update reopened the batch before the callback went out
    c = Completion(7, 0, 5, "failure", 4, 1, 0, T0 + 61_000)
    out = as_of_completion(live, c)
    assert out == live | {"state": "failure", "complete": True, "n_jobs": 5, "n_completed": 5,
                          "n_failed": 1, "time_completed": format_time_ms(T0 + 61_000),
                          "duration_ms": 61_000, "duration": "1 minute 1s"}
    assert live["complete"] is False  # not mutated


def test_group_payload_duration_is_an_integer() -> None:
    live = {"batch_id": 7, "job_group_id": 2, "state": "success", "complete": True, "n_jobs": 2,
            "n_completed": 2, "n_succeeded": 2, "n_failed": 0, "n_cancelled": 0,
            "time_created": format_time_ms(T0), "time_completed": format_time_ms(T0 + 5),
            "duration": 5, "cost": 0.0, "cost_breakdown": []}
    assert as_of_completion(live, Completion(7, 2, 2, "success", 2, 0, 0, T0 + 5)) == live


@given(st.integers(0, 2**42))
def test_parse_time_inverts_format(ms: int) -> None:
    assert parse_time(format_time_ms(ms)) == ms


@pytest.mark.parametrize("text", [None, 5, "", "yesterday", "2026-01-01"], ids=str)
def test_parse_time_of_anything_else_is_none(text: object) -> None:
    assert parse_time(text) is None


def test_the_callback_intake_fetch_wait_is_configurable_and_bounded() -> None:
    assert load_completions_settings({}).intake_fetch_wait_ms == 250
    assert load_completions_settings(
        {"HS_COMPLETIONS_FETCH_WAIT_MS": "40"}).intake_fetch_wait_ms == 40
    with pytest.raises(ValueError, match="HS_COMPLETIONS_FETCH_WAIT_MS"):
        load_completions_settings({"HS_COMPLETIONS_FETCH_WAIT_MS": "-1"})


@given(st.one_of(st.none(), st.integers(0, 2**42)), st.integers(0, 2**42),
       st.floats(0.001, 3600))
def test_the_sender_sleeps_until_the_next_due_delivery_at_most_idle_s(
        next_due: int | None, now: int, idle_s: float) -> None:
    wait = sender_wait_s(next_due, now, idle_s=idle_s)
    assert 0 <= wait <= idle_s
    if next_due is None:
        assert wait == idle_s
    elif next_due <= now:
        assert wait == 0
    else:
        assert wait == min((next_due - now) / 1000, idle_s)


@pytest.mark.parametrize(("next_due", "expected"), [
    (None, 5.0), (T0 - 1, 0.0), (T0, 0.0), (T0 + 1_500, 1.5), (T0 + 60_000, 5.0),
], ids=["nothing-pending", "overdue", "due-now", "in-1.5s", "later-than-idle"])
def test_sender_wait_examples(next_due: int | None, expected: float) -> None:
    assert sender_wait_s(next_due, T0, idle_s=5.0) == expected


def test_sender_wait_rejects_a_non_positive_idle() -> None:
    with pytest.raises(ValueError, match="idle_s"):
        sender_wait_s(None, T0, idle_s=0)


def test_the_sender_idle_setting() -> None:
    assert load_completions_settings({}).idle_s == 5.0
    assert load_completions_settings({"HS_COMPLETIONS_IDLE_S": "30"}).idle_s == 30.0
    with pytest.raises(ValueError, match="HS_COMPLETIONS_IDLE_S"):
        load_completions_settings({"HS_COMPLETIONS_IDLE_S": "0"})
