"""bench.lane: a bulk lane's stages in one process, on the replay bench's log."""

from __future__ import annotations

import pytest

from bench import lane
from schemas.batch import UpdateCommitted


def test_a_round_times_every_stage_of_the_whole_log() -> None:
    out = lane.run(300, rounds=2)
    assert out["events"] == len(lane.encoded_log(300)) > 900
    assert set(out["us_per_event"]) == set(lane.STAGES)
    assert all(v > 0 for v in out["us_per_event"].values())
    for stage, (low, high) in out["us_per_event_range"].items():
        assert low <= out["us_per_event"][stage] <= high
    assert out["us_per_event_total"] >= max(out["us_per_event"].values())


def test_a_log_the_fold_does_not_take_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures are a bulk lane's only if every batch folds: a log with a batch the fold
    leaves to the sink (here, committed twice over with a different count) is refused."""
    real = lane.generate

    def with_a_bad_commit(n_jobs: int, batch_size: int) -> list:  # type: ignore[type-arg]
        events = real(n_jobs, batch_size)
        return [*events, UpdateCommitted(batch_id=1, update_id=2, n_jobs=1, n_job_groups=0)]

    monkeypatch.setattr(lane, "generate", with_a_bad_commit)
    with pytest.raises(RuntimeError, match="fold takes"):
        lane.one_round(lane.encoded_log(50))
