"""The worker outbox's bunching: MJCs of a batch become one record that says what they said."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import AnyEvent
from schemas.execution import AttemptHeartbeat, JobCompleted, JobsCompleted, JobStarted
from services.worker.outbox import bunch_completions


def _event(kind: str, b: int, j: int, inst: str) -> AnyEvent:
    if kind == "mjc":
        return JobCompleted(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name=inst,
                            state="Success" if j % 3 else "Failed", exit_code=j % 3,
                            start_time_ms=j, end_time_ms=j + 5, status=f'{{"j":{j}}}',
                            start_reported=j % 2 == 0)
    if kind == "mjs":
        return JobStarted(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name=inst,
                          start_time_ms=j)
    return AttemptHeartbeat(batch_id=b, job_id=j, attempt_id=f"a{j}", instance_name=inst,
                            rollup_time_ms=j)


def _expanded(records: list[AnyEvent]) -> list[AnyEvent]:
    return [e for r in records
            for e in (r.expand() if isinstance(r, JobsCompleted) else [r])]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["mjc", "mjc", "mjs", "beat"]), st.integers(1, 3),
                          st.integers(1, 40), st.sampled_from(["w1", "w2"])), max_size=50),
       st.integers(1, 5))
def test_bunches_say_what_the_single_mjcs_say(spec: list[tuple[str, int, int, str]],
                                              max_attempts: int) -> None:
    events = [_event(*s) for s in spec]
    records = bunch_completions(events, max_attempts)
    flat = _expanded(records)
    assert sorted(map(repr, flat)) == sorted(map(repr, events))  # nothing lost or added
    keys = {(e.batch_id, getattr(e, "instance_name", "")) for e in events
            if isinstance(e, JobCompleted)}
    for key in keys:  # each batch's (and instance's) MJCs keep their order
        def mine(seq: list[AnyEvent], key: tuple[int, str] = key) -> list[AnyEvent]:
            return [e for e in seq if isinstance(e, JobCompleted)
                    and (e.batch_id, e.instance_name) == key]
        assert mine(flat) == mine(events)
    others = [e for e in events if not isinstance(e, JobCompleted)]
    assert [e for e in records if not isinstance(e, JobCompleted | JobsCompleted)] == others
    for r in records:
        if isinstance(r, JobsCompleted):
            assert 2 <= len(r.attempts) <= max_attempts
    # As few records as the cap allows: at most one bunch per key that is not full.
    partial = [r for r in records if (isinstance(r, JobCompleted) and max_attempts > 1)
               or (isinstance(r, JobsCompleted) and len(r.attempts) < max_attempts)]
    assert len(partial) <= len(keys)


def test_a_lone_completion_stays_a_single_mjc() -> None:
    mjc = _event("mjc", 1, 1, "w1")
    beat = _event("beat", 1, 2, "w1")
    assert bunch_completions([beat, mjc, _event("mjc", 2, 3, "w1")])[:2] == [beat, mjc]
