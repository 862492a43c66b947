"""The projector's batch wait, execution linger and read-ahead: from the environment, refused
when out of range; which batches linger."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from schemas import samples
from schemas.batch import JobsSubmitted
from schemas.envelope import wrap
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptHeartbeat,
    JobCompleted,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
)
from services.common.log import Record
from services.common.settings import Settings
from services.projector.app import (
    BATCH_SIZE,
    BATCH_WITHIN_ENV,
    BATCH_WITHIN_S,
    EXECUTION_LINGER_ENV,
    EXECUTION_LINGER_S,
    STREAM_BUFFER,
    STREAM_BUFFER_ENV,
    batch_within_s,
    create_app,
    execution_linger_s,
    lagging,
    lingers,
    stream_buffer,
    transactions,
)


def test_the_default_and_an_override() -> None:
    assert batch_within_s({}) == BATCH_WITHIN_S
    assert batch_within_s({BATCH_WITHIN_ENV: ""}) == BATCH_WITHIN_S
    assert batch_within_s({BATCH_WITHIN_ENV: "50"}) == 0.05
    assert batch_within_s({BATCH_WITHIN_ENV: "0"}) == 0.0


@pytest.mark.parametrize(("raw", "why"), [
    ("0.05", "whole milliseconds"), ("ten", "whole milliseconds"), ("-1", "between 0 and 5000"),
    ("5001", "between 0 and 5000")])
def test_bad_values_say_what_is_wrong(raw: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as e:
        batch_within_s({BATCH_WITHIN_ENV: raw})
    assert BATCH_WITHIN_ENV in str(e.value)


def test_the_execution_linger_default_an_override_and_a_bad_value() -> None:
    assert execution_linger_s({}) == EXECUTION_LINGER_S
    assert execution_linger_s({EXECUTION_LINGER_ENV: "0"}) == 0.0
    assert execution_linger_s({EXECUTION_LINGER_ENV: "120"}) == 0.12
    with pytest.raises(ValueError, match=f"{EXECUTION_LINGER_ENV} must be between"):
        execution_linger_s({EXECUTION_LINGER_ENV: "9000"})


def test_the_read_ahead_default_an_override_and_bad_values() -> None:
    assert stream_buffer({}) == STREAM_BUFFER
    assert stream_buffer({STREAM_BUFFER_ENV: ""}) == STREAM_BUFFER
    assert stream_buffer({STREAM_BUFFER_ENV: "64"}) == 64
    for raw, why in [("ten", "whole number of records"), ("1.5", "whole number of records"),
                     ("7", "between 8 and 65536"), ("70000", "between 8 and 65536")]:
        with pytest.raises(ValueError, match=why) as e:
            stream_buffer({STREAM_BUFFER_ENV: raw})
        assert STREAM_BUFFER_ENV in str(e.value)


@pytest.mark.parametrize("given", [None, 32])
def test_the_app_reads_ahead_at_most_its_buffer(tmp_path: Path,
                                                given: int | None) -> None:
    """faust pauses fetching a partition once that many records wait for the agent: far
    fewer than its default, so a projector behind a big submission does not hold thousands of
    decompressed job bunches."""
    engine = sa.create_engine("sqlite://")
    try:
        app = create_app(Settings(data_dir=str(tmp_path)), engine,
                         **({} if given is None else {"stream_buffer": given}))
        assert app.conf.stream_buffer_maxsize == (STREAM_BUFFER if given is None else given)
        assert app.conf.stream_buffer_maxsize < 4096
    finally:
        engine.dispose()


def _records(events: list[AnyEvent]) -> list[Record]:
    return [Record("batch-events", 0, i, wrap(e, event_id=f"e{i}", time_ms=i))
            for i, e in enumerate(events)]


REPORTS = (JobScheduled, JobsScheduled, JobStarted, JobCompleted, JobsCompleted, AttemptHeartbeat)


def test_only_batches_of_execution_reports_linger() -> None:
    events = samples.sample_events()
    reports = [e for e in events if isinstance(e, REPORTS)]
    others = [e for e in events if not isinstance(e, REPORTS)]
    assert {type(e) for e in reports} == set(REPORTS)  # every kind of report is in the samples
    assert lingers(_records(reports))
    assert not lingers([])
    submitted = next(e for e in others if isinstance(e, JobsSubmitted))
    # One event a client waits for (read-your-writes) and the batch is applied at once.
    assert not lingers(_records([*reports, submitted]))
    for other in others:
        assert not lingers(_records([reports[0], other])), type(other).__name__
    # A full batch is big enough already.
    assert not lingers(_records(reports[:1] * BATCH_SIZE))

def test_a_batch_a_second_old_is_lagging() -> None:
    reports = [e for e in samples.sample_events() if isinstance(e, REPORTS)]
    newest = max(r.envelope.time_ms for r in _records(reports))
    assert lagging(_records(reports), newest + 1_000)
    assert lagging(_records(reports), newest + 60_000)
    assert not lagging(_records(reports), newest + 999) and not lagging([], newest + 9_999)


def _event(i: int, size: int) -> SimpleNamespace:
    return SimpleNamespace(i=i, message=SimpleNamespace(value=b"x" * size))


@given(st.lists(st.integers(0, 40), max_size=30), st.integers(1, 60))
def test_a_batch_is_applied_in_runs_of_bounded_bytes_in_order(sizes: list[int],
                                                              max_bytes: int) -> None:
    events = [_event(i, n) for i, n in enumerate(sizes)]
    runs = list(transactions(events, max_bytes))
    assert [e.i for run in runs for e in run] == list(range(len(sizes)))  # all, in order
    assert all(runs)
    for run in runs:
        size = sum(len(e.message.value) for e in run)
        assert size <= max_bytes or len(run) == 1  # a record bigger than the bound: alone
    for run, after in itertools.pairwise(runs):  # each run is as long as it may be
        assert sum(len(e.message.value) for e in [*run, after[0]]) > max_bytes


def test_execution_batches_are_not_split() -> None:
    assert len(list(transactions([_event(i, 400) for i in range(BATCH_SIZE)]))) == 1
