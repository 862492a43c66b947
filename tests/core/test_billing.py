"""Billing arithmetic: resources, accrual over heartbeats, rollups that sum exactly."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.billing import (
    IP_FEE,
    SERVICE_FEE,
    Machine,
    UsageTexts,
    add_usage,
    attempt_resources,
    billable,
    by_day,
    compute_product,
    cost,
    cost_breakdown,
    cost_str,
    default_rates,
    fold_version,
    machine_of,
    memory_product,
    msec_mcpu,
    over_limit,
    resources_of_text,
    resources_text,
    usage,
    usage_of_text,
    usage_text,
)
from core.projection.billing import (
    BATCH,
    BILLING_PROJECT,
    BILLING_PROJECT_USER_DATE,
    JOB_GROUP,
    USER,
    Accruals,
    Billed,
    accrue,
    accrue_into,
)
from core.projection.ops import Increments, merge_increments
from schemas.base import AttemptResource

DAY = 86_400_000


def test_default_rates_cover_every_worker_type_preemptible_or_not_and_job_private() -> None:
    rates = default_rates()
    for worker_type in ("highcpu", "standard", "highmem", "job-private"):
        for preemptible in (True, False):
            assert f"{compute_product(worker_type, preemptible)}/1" in rates
            assert f"{memory_product(worker_type, preemptible)}/1" in rates
    assert f"{SERVICE_FEE}/1" in rates and f"{IP_FEE}/1" in rates
    assert all(r > 0 for r in rates.values())
    # a preemptible core is cheaper than a non-preemptible one
    assert rates["compute/standard-preemptible/1"] < rates["compute/standard-nonpreemptible/1"]
    # an hour of one preemptible core costs its hourly price
    hour = rates["compute/standard-preemptible/1"] * 1000 * 3_600_000
    assert abs(hour - Decimal("0.006655")) < Decimal("1e-12")


def test_attempt_resources_in_the_reference_units() -> None:
    machine = Machine("highmem", preemptible=False, worker_cores_mcpu=16_000)
    got = {r.resource: r.quantity for r in attempt_resources(2000, machine)}
    assert got == {
        "compute/highmem-nonpreemptible/1": 2000,           # mCPU
        "memory/highmem-nonpreemptible/1": 2 * 6656,        # MiB: 2 cores of highmem
        "service-fee/1": 2000,                              # mCPU
        "ip-fee/1024/1": 1024 * 2 // 16,                    # 1/1024 of a worker
    }
    latest = {"compute/highmem-nonpreemptible": "3"}
    names = [r.resource for r in attempt_resources(2000, machine, latest)]
    assert "compute/highmem-nonpreemptible/3" in names and "service-fee/1" in names
    assert names == sorted(names)


@given(st.dictionaries(st.text(min_size=1, max_size=30), st.integers(0, 2**62), max_size=6))
def test_resources_text_round_trips_whatever_the_order(resources: dict[str, int]) -> None:
    text = resources_text(resources)
    assert resources_of_text(text) == resources
    assert text == resources_text(dict(reversed(resources.items())))  # the same text
    if text is not None:
        assert list(resources_of_text(text)) == sorted(resources)


def test_resources_text_is_compact_sorted_json_and_null_for_none() -> None:
    assert resources_text({"service-fee/1": 1000, "compute/n1-standard/1": 1000}) == (
        '{"compute/n1-standard/1":1000,"service-fee/1":1000}')
    assert resources_text({}) is None
    assert resources_of_text(None) == {}
    for bad in ('["a"]', '{"a":1.5}', '{"a":"1"}', "{"):
        with pytest.raises(ValueError):
            resources_of_text(bad)


def test_machine_of_pools_and_job_private_machines() -> None:
    assert machine_of("highcpu-np", "local-highcpu-np-16", False, 16_000) == Machine(
        "highcpu", False, 16_000)
    assert machine_of("standard", "local-standard-16", True, 16_000).worker_type == "standard"
    assert machine_of("job-private", "n1-highmem-8", True, 8000).worker_type == "highmem"
    assert machine_of("job-private", "job-private", True, 8000).worker_type == "job-private"


def test_latest_version_is_the_highest_number() -> None:
    latest: dict[str, str] = {}
    for r in ("compute/x/1", "compute/x/3", "compute/x/2", "memory/y/1", "service-fee"):
        fold_version(latest, r)
    assert latest == {"compute/x": "3", "memory/y": "1", "service-fee": "1"}


def test_billable_moves_forward_only_and_stops_at_the_end() -> None:
    assert billable(None, None, None, 100) is None           # not started
    assert billable(10, None, None, 100) == (10, 100)         # first heartbeat
    assert billable(10, 100, None, 100) is None               # duplicate
    assert billable(10, 100, None, 90) is None                # stale
    assert billable(10, 100, 150, 200) == (100, 150)          # late report capped at the end
    assert billable(10, 150, 150, 150) is None                # duplicate completion


def test_cost_str_and_limits() -> None:
    assert cost_str(Decimal(0)) == "$0.0000"
    assert cost_str(Decimal("0.00001")) == "<$0.0001"
    assert cost_str(Decimal("1.23456")) == "$1.2346"
    assert over_limit(Decimal(5), Decimal(5)) and not over_limit(Decimal(4), Decimal(5))
    assert not over_limit(Decimal(10**6), None)


def test_cost_and_breakdown() -> None:
    rates = {"a/1": Decimal("0.5"), "b/1": Decimal("0.25")}
    usages = {"a/1": 4, "b/1": 8, "c/1": 100}  # c has no rate: it costs nothing
    assert cost(usages, rates) == Decimal(4)
    assert cost_breakdown(usages, rates) == [("a/1", Decimal(2)), ("b/1", Decimal(2)),
                                             ("c/1", Decimal(0))]
    assert msec_mcpu({"compute/x/1": 7, "compute/y/2": 3, "memory/x/1": 100}) == 10


resources_st = st.lists(st.builds(AttemptResource, resource=st.sampled_from(
    ["compute/s/1", "memory/s/1", "service-fee/1", "ip-fee/1024/1"]),
    quantity=st.integers(1, 100_000)), min_size=1, max_size=4, unique_by=lambda r: r.resource)


@settings(max_examples=200, deadline=None)
@given(resources_st, st.integers(0, 10 * DAY), st.integers(1, 3 * DAY), st.data())
def test_heartbeats_in_any_order_bill_exactly_start_to_end(
        resources: list[AttemptResource], start: int, length: int, data: st.DataObject) -> None:
    """However heartbeats interleave, repeat or arrive late, the attempt bills start..end once."""
    end = start + length
    beats = data.draw(st.lists(st.integers(start - 10, end), max_size=12))
    reports: list[tuple[int, int | None]] = [(t, None) for t in beats] + [(end, end)]
    order = data.draw(st.permutations(reports))
    # the completion may be reported twice, and heartbeats may follow it
    cut = data.draw(st.integers(0, len(order)))
    order = [*order[:cut], (end, end), *order[cut:]]
    rollup: int | None = None
    ended: int | None = None
    total: dict[str, int] = defaultdict(int)
    for to, end_ms in order:
        ended = end_ms if end_ms is not None else ended
        interval = billable(start, rollup, ended, to)
        if interval is None:
            continue
        assert interval[0] < interval[1]
        rollup = interval[1]
        for r, u in usage(resources, *interval).items():
            total[r] += u
    assert dict(total) == usage(resources, start, end)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400 * DAY), st.integers(0, 5 * DAY))
def test_by_day_partitions_the_interval(start: int, length: int) -> None:
    parts = by_day(start, start + length)
    assert sum(b - a for _, a, b in parts) == length
    assert all(a < b for _, a, b in parts)
    assert [a for _, a, _ in parts[1:]] == [b for _, _, b in parts[:-1]]
    dates = [d for d, _, _ in parts]
    assert dates == sorted(set(dates))
    assert all(d == dt.datetime.fromtimestamp(a / 1000, tz=dt.UTC).date() for d, a, _ in parts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.integers(1, 3),                      # batch
    st.integers(1, 5),                      # job
    st.sampled_from([[0], [1, 0], [2, 1, 0]]),  # group ancestry
    st.sampled_from(["p1", "p2"]),          # billing project
    st.sampled_from(["alice", "bob"]),      # user
    resources_st,
    st.integers(0, 3 * DAY),                # from
    st.integers(0, 2 * DAY),                # length
    st.integers(0, 3),                      # token
), max_size=12))
def test_rollups_equal_the_sum_of_their_parts(intervals: list[tuple]) -> None:  # type: ignore[type-arg]
    """Every rollup total, in integer units, equals the sum of its jobs' usage."""
    tables: dict[str, dict[tuple[object, ...], int]] = defaultdict(lambda: defaultdict(int))
    expected_by_job: dict[tuple[int, int, str], int] = defaultdict(int)
    meta: dict[tuple[int, int], tuple[list[int], str, str]] = {}
    keys_seen: list[tuple[str, ...]] = []
    for b, j, groups, project, user, resources, start, length, token in intervals:
        groups, project, user = meta.setdefault((b, j), (groups, project, user))
        ops = accrue(Billed(b, j, groups, project, user), resources, start, start + length,
                     token)
        for r, u in usage(resources, start, start + length).items():
            expected_by_job[(b, j, r)] += u
        for op in ops:
            assert op.deltas["resource_usage"] > 0
            keys_seen.append(tuple(op.key))
            key = tuple(v for k, v in sorted(op.key.items()) if k != "token")
            tables[op.table][key] += op.deltas["resource_usage"]

    def total(table: str, pick: object) -> dict[object, int]:
        out: dict[object, int] = defaultdict(int)
        for key, u in tables[table].items():
            out[pick(key)] += u  # type: ignore[operator]
        return dict(out)

    # a job's own usage is not a rollup row (it is its row's resource_usage): none for a job
    assert all("job_id" not in op_key for op_key in keys_seen)
    jobs = {k: v for k, v in expected_by_job.items() if v}
    by_batch: dict[tuple[int, str], int] = defaultdict(int)
    by_project: dict[tuple[str, str], int] = defaultdict(int)
    by_user: dict[tuple[str, str], int] = defaultdict(int)
    for (b, j, r), u in jobs.items():
        groups, project, user = meta[(b, j)]
        by_batch[(b, r)] += u
        by_project[(project, r)] += u
        by_user[(user, r)] += u
    assert dict(tables[BATCH]) == dict(by_batch)
    assert dict(tables[BILLING_PROJECT]) == dict(by_project)
    assert dict(tables[USER]) == {(r, user): u for (user, r), u in by_user.items()}
    # group 0 is the whole batch; the by-date table sums to the project's total
    group0 = {(k[0], k[2]): u for k, u in tables[JOB_GROUP].items() if k[1] == 0}
    assert group0 == dict(by_batch)
    dated = total(BILLING_PROJECT_USER_DATE, lambda k: (k[0], k[1]))  # (project, resource)
    assert dated == dict(by_project)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.integers(1, 3),                      # batch
    st.integers(1, 5),                      # job
    st.sampled_from([[0], [1, 0], [2, 1, 0]]),  # group ancestry
    st.sampled_from(["p1", "p2"]),          # billing project
    resources_st,
    st.integers(0, 3 * DAY),                # from
    st.sampled_from([0, 1, 999, DAY - 1, DAY, DAY + 1, 2 * DAY + 7]),  # length
    st.integers(0, 2),                      # token
), max_size=10))
def test_accrue_into_adds_what_accrue_returns(intervals: list[tuple]) -> None:  # type: ignore[type-arg]
    """The projector's fast path bills the same rows by the same amounts as the ops."""
    acc = Increments()
    ops = []
    for b, j, groups, project, resources, start, length, token in intervals:
        who = Billed(b, j, groups, project, "alice")
        ops += accrue(who, resources, start, start + length, token)
        accrue_into(acc, who, {r.resource: r.quantity for r in resources}, start,
                    start + length, token)
    assert acc.drain() == merge_increments(ops)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.integers(1, 3),                      # batch
    st.integers(1, 5),                      # job
    st.sampled_from([[0], [1, 0], [2, 1, 0]]),  # group ancestry
    st.sampled_from(["p1", "p2"]),          # billing project
    st.sampled_from(["alice", "bob"]),      # user
    resources_st,
    st.integers(0, 3 * DAY),                # from
    st.sampled_from([0, 1, 999, DAY - 1, DAY, DAY + 1, 2 * DAY + 7]),  # length
    st.integers(0, 2),                      # token
), max_size=30), st.integers(1, 30))
def test_accruals_summed_first_bill_what_every_interval_bills(
        intervals: list[tuple], drain_every: int) -> None:  # type: ignore[type-arg]
    """Summing many attempts' intervals before the rollups (the projector's way) bills the same
    rows by the same amounts as each interval's ops, however often it is drained."""
    acc = Increments()
    accruals = Accruals()
    ops = []
    for i, (b, j, groups, project, user, resources, start, length, token) in enumerate(
            intervals):
        who = Billed(b, j, groups, project, user)
        ops += accrue(who, resources, start, start + length, token)
        accruals.add(who, {r.resource: r.quantity for r in resources}, start, start + length,
                     token)
        if i % drain_every == 0:
            accruals.drain_into(acc)
    accruals.drain_into(acc)
    assert acc.drain() == merge_increments(ops)
    accruals.drain_into(acc)
    assert acc.drain() == []  # drained means empty


def test_accrue_over_midnight_splits_the_dated_rollup() -> None:
    who = Billed(1, 1, [0], "p", "u")
    ops = accrue(who, [AttemptResource(resource="compute/s/1", quantity=1000)],
                 DAY - 10, DAY + 30, token=2)
    dated = [op for op in ops if op.table == BILLING_PROJECT_USER_DATE]
    assert [(op.key["usage_date"], op.deltas["resource_usage"]) for op in dated] == [
        ("1970-01-01", 10_000), ("1970-01-02", 30_000)]
    assert all(op.key.get("token") == 2 for op in ops)
    assert accrue(who, [AttemptResource(resource="compute/s/1", quantity=1000)], 5, 5, 0) == []


@pytest.mark.parametrize("cores", [250, 1000, 16_000])
def test_ip_fee_is_a_share_of_the_worker(cores: int) -> None:
    machine = Machine("standard", True, 16_000)
    ip = next(r for r in attempt_resources(cores, machine) if r.resource.startswith("ip-fee"))
    assert ip.quantity == max(1, 1024 * cores // 16_000)


@given(st.dictionaries(st.text(min_size=1, max_size=30), st.integers(-(2**63), 2**63 - 1),
                       max_size=8))
def test_usage_text_round_trips_without_zeros_whatever_the_order(
        usage_by_resource: dict[str, int]) -> None:
    text = usage_text(usage_by_resource)
    nonzero = {r: u for r, u in usage_by_resource.items() if u}
    assert usage_of_text(text) == nonzero
    assert (text is None) == (not nonzero)
    assert usage_text(dict(reversed(list(usage_by_resource.items())))) == text


@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(-(2**40), 2**40)),
                max_size=8),
       st.lists(st.integers(1, 2**40), min_size=1, max_size=4))
def test_usage_texts_are_usage_text_of_quantities_times_ms(
        quantities: list[tuple[str, int]], durations: list[int]) -> None:
    """The rebuild's formats render what usage_text does: any resource name (quotes,
    backslashes, %, non-ASCII), zero and negative quantities, one format used many times."""
    texts = UsageTexts()
    key = tuple(quantities)
    for ms in durations:
        assert texts.text(key, ms) == usage_text({r: q * ms for r, q in dict(key).items()})


@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(-(2**40), 2**40)),
                max_size=8),
       st.lists(st.integers(1, 2**40), min_size=1, max_size=4))
def test_a_usage_is_its_text_and_its_pieces_join_around_the_numbers(
        quantities: list[tuple[str, int]], durations: list[int]) -> None:
    """What a load has MariaDB concatenate (the pieces around each quantity times the ms) is
    the text, and a job's usage is usage_text's; the jobs of a set share one format."""
    texts = UsageTexts()
    key = tuple(quantities)
    formats = set()
    for ms in durations:
        usage = texts.usage(key, ms)
        expected = usage_text({r: q * ms for r, q in dict(key).items()})
        if usage is None:
            assert expected is None
            continue
        assert usage.ms == ms and usage.text() == expected
        fmt = usage.format
        formats.add(id(fmt))
        assert len(fmt.pieces) == len(fmt.per_ms) + 1
        joined = fmt.pieces[0] + "".join(
            str(q * ms) + piece for q, piece in zip(fmt.per_ms, fmt.pieces[1:], strict=True))
        assert joined == expected
    assert len(formats) <= 1


def test_usage_texts_refuse_a_duration_without_usage() -> None:
    with pytest.raises(ValueError, match="positive"):
        UsageTexts().text((("compute/1", 5),), 0)
    assert UsageTexts().text((("compute/1", 0),), 7) is None
    assert UsageTexts().text((('50% "off"', 2),), 3) == '[["50% \\"off\\"",6]]'


def test_usage_text_is_pairs_sorted_by_resource() -> None:
    assert usage_text({"memory/1": 5, "compute/1": 7, "disk/1": 0}) == (
        '[["compute/1",7],["memory/1",5]]')
    assert usage_text({}) is None and usage_of_text(None) == {}
    with pytest.raises(ValueError):
        usage_of_text('{"compute/1": 7}')


@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(["a", "b", "c"]),
                                          st.integers(0, 10**6), max_size=3),
                          st.integers(0, 10**9)), max_size=6))
def test_add_usage_is_usage_summed(bills: list[tuple[dict[str, int], int]]) -> None:
    into: dict[str, int] = {}
    want: dict[str, int] = {}
    for quantities, ms in bills:
        add_usage(into, quantities, ms)
        for r, u in usage([AttemptResource(resource=r, quantity=q) for r, q in quantities.items()],
                          0, ms).items():
            want[r] = want.get(r, 0) + u
    assert {r: u for r, u in into.items() if u} == {r: u for r, u in want.items() if u}
