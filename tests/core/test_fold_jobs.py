"""fold_jobs: a bunch's job rows, parent edges and attribute rows (the name is a column)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from core.projection.fold import NAME, fold_jobs
from core.projection.ops import InsertIgnore, Op, Row
from schemas.base import JobResources
from schemas.batch import JobRecord, JobsSubmitted

keys = st.sampled_from([NAME, "team", "stage", "x'y"])
jobs = st.lists(st.tuples(st.dictionaries(keys, st.text(max_size=5), max_size=3),
                          st.lists(st.integers(1, 50), max_size=3, unique=True)),
                min_size=1, max_size=8)


def _event(specs: list[tuple[dict[str, str], list[int]]]) -> JobsSubmitted:
    return JobsSubmitted(batch_id=7, update_id=2, jobs=[
        JobRecord(job_id=100 + i, job_group_id=0, parent_ids=parents, attributes=attrs,
                  resources=JobResources(cores_mcpu=1000, memory_bytes=1 << 30),
                  inst_coll="standard", spec="{}")
        for i, (attrs, parents) in enumerate(specs)])


def _table(ops: Sequence[Op], table: str) -> list[Row]:
    return [row for op in ops if isinstance(op, InsertIgnore) and op.table == table
            for row in op.rows]


@given(jobs)
def test_every_attribute_and_edge_is_one_row_or_the_name_column(
        specs: list[tuple[dict[str, str], list[int]]]) -> None:
    ops = fold_jobs(_event(specs))
    rows = _table(ops, "jobs")
    assert [(r["job_id"], r["name"]) for r in rows] == [
        (100 + i, attrs.get(NAME)) for i, (attrs, _) in enumerate(specs)]
    attrs_rows = {(r["job_id"], r["attr_key"], r["attr_value"])
                  for r in _table(ops, "job_attributes")}
    assert attrs_rows == {(100 + i, k, v) for i, (attrs, _) in enumerate(specs)
                          for k, v in attrs.items() if k != NAME}
    edges = [(r["job_id"], r["parent_id"]) for r in _table(ops, "job_parents")]
    assert edges == [(100 + i, p) for i, (_, parents) in enumerate(specs) for p in parents]
    assert [(r["state"], r["n_pending_parents"]) for r in rows] == [
        ("Pending", len(parents)) if parents else ("Ready", 0) for _, parents in specs]


def test_a_job_named_and_nothing_else_is_one_row() -> None:
    ops = fold_jobs(_event([({NAME: "align"}, [])]))
    assert [op.table for op in ops if isinstance(op, InsertIgnore)] == ["jobs"]
