from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import BadRequest
from core.query import (
    QueryError,
    default_batch_query,
    parse_batch_query,
    parse_job_query,
    render_query,
)
from core.query_ast import (
    BATCH_STATE_WORDS,
    JOB_STATE_WORDS,
    AnyFilter,
    AttributeMatch,
    BatchIdCompare,
    BatchStateIs,
    BillingProjectIs,
    CostCompare,
    DurationCompare,
    ExitCodeCompare,
    HasAttribute,
    InstanceCollectionMatch,
    InstanceMatch,
    JobIdCompare,
    JobStateIn,
    KeywordMatch,
    TimeCompare,
    UserIs,
)
from core.query_v2 import FIELD_NAMES

JAN_1_2024_MS = 1_704_067_200_000

# (q, expected filters)
JOB_V1: list[tuple[str, list[Any]]] = [
    ("", []),
    ("   ", []),
    ("name=foo", [AttributeMatch(key="name", op="=", value="foo")]),
    ("!name=foo", [AttributeMatch(key="name", op="=", value="foo", negate=True)]),
    ("a=b=c", [AttributeMatch(key="a", op="=", value="b=c")]),
    ("k=", [AttributeMatch(key="k", op="=", value="")]),
    ("has:a=b", [AttributeMatch(key="has:a", op="=", value="b")]),
    ("job_id=7", [JobIdCompare(op="=", value=7)]),
    ("!job_id=7", [JobIdCompare(op="=", value=7, negate=True)]),
    ("has:foo", [HasAttribute(key="foo")]),
    ("!has:foo", [HasAttribute(key="foo", negate=True)]),
    ("live", [JobStateIn(states=("Ready", "Creating", "Running"))]),
    ("bad", [JobStateIn(states=("Error", "Failed"))]),
    ("done", [JobStateIn(states=("Cancelled", "Error", "Failed", "Success"))]),
    ("!success", [JobStateIn(states=("Success",), negate=True)]),
    ("pending\tready", [JobStateIn(states=("Pending",)), JobStateIn(states=("Ready",))]),
    *[(word, [JobStateIn(states=states)]) for word, states in JOB_STATE_WORDS.items()],
]

BATCH_V1: list[tuple[str, list[Any]]] = [
    ("", []),
    ("a=b", [AttributeMatch(key="a", op="=", value="b")]),
    ("!has:a", [HasAttribute(key="a", negate=True)]),
    ("user:alice", [UserIs(user="alice")]),
    ("!user:alice", [UserIs(user="alice", negate=True)]),
    ("billing_project:p1", [BillingProjectIs(billing_project="p1")]),
    ("!billing_project:p1", [BillingProjectIs(billing_project="p1", negate=True)]),
    ("user:a=b", [AttributeMatch(key="user:a", op="=", value="b")]),
    ("!cancelled", [BatchStateIs(state="cancelled", negate=True)]),
    *[(word, [BatchStateIs(state=word)]) for word in BATCH_STATE_WORDS],
]

JOB_V2: list[tuple[str, list[Any]]] = [
    ("", []),
    ("\n  \n", []),
    ("foo", [KeywordMatch(word="foo", exact=False)]),
    ('"foo"', [KeywordMatch(word="foo", exact=True)]),
    ('"a"b"', [KeywordMatch(word='a"b', exact=True)]),
    ("instance = i-1", [InstanceMatch(op="=", value="i-1")]),
    ("instance==i-1", [InstanceMatch(op="=", value="i-1")]),
    ("instance != i-1", [InstanceMatch(op="!=", value="i-1")]),
    ("instance =~ i-", [InstanceMatch(op="=~", value="i-")]),
    ("instance !~ i-", [InstanceMatch(op="!~", value="i-")]),
    ("instance_collection = standard",
     [InstanceCollectionMatch(op="=", value="standard")]),
    ("instance_collection=~high", [InstanceCollectionMatch(op="=~", value="high")]),
    ("job_id >= 3", [JobIdCompare(op=">=", value=3)]),
    ("job_id<3", [JobIdCompare(op="<", value=3)]),
    ("job_id != 3", [JobIdCompare(op="!=", value=3)]),
    ("exit_code = 0", [ExitCodeCompare(op="=", value=0)]),
    ("exit_code > 1", [ExitCodeCompare(op=">", value=1)]),
    ("exit_code = NULL", [ExitCodeCompare(op="=", value=None)]),
    ("exit_code != null", [ExitCodeCompare(op="!=", value=None)]),
    ("state = live", [JobStateIn(states=("Ready", "Creating", "Running"))]),
    ("state != bad", [JobStateIn(states=("Error", "Failed"), negate=True)]),
    ("state == done", [JobStateIn(states=("Cancelled", "Error", "Failed", "Success"))]),
    ("start_time >= 2024-01-01T00:00:00Z",
     [TimeCompare(field="start_time", op=">=", epoch_ms=JAN_1_2024_MS)]),
    ("start_time > 2024-01-01",
     [TimeCompare(field="start_time", op=">", epoch_ms=JAN_1_2024_MS)]),
    ("end_time < 2024-01-01T01:00:00.5+01:00",
     [TimeCompare(field="end_time", op="<", epoch_ms=JAN_1_2024_MS + 500)]),
    ("duration > 1.5", [DurationCompare(op=">", ms=1500)]),
    ("duration <= 0.0019", [DurationCompare(op="<=", ms=1)]),
    ("duration = 1.001", [DurationCompare(op="=", ms=1001)]),
    ("cost > $0.01", [CostCompare(op=">", value=Decimal("0.01"))]),
    ("cost <= 2", [CostCompare(op="<=", value=Decimal(2))]),
    ("name = hello", [AttributeMatch(key="name", op="=", value="hello")]),
    ("name != hello", [AttributeMatch(key="name", op="!=", value="hello")]),
    ("name =~ ell", [AttributeMatch(key="name", op="=~", value="ell")]),
    ("name !~ ell", [AttributeMatch(key="name", op="!~", value="ell")]),
    ("name =~ a=b", [AttributeMatch(key="name", op="=~", value="a=b")]),
    ("user = alice", [AttributeMatch(key="user", op="=", value="alice")]),
    ("  state = running  \r\n job_id = 1",
     [JobStateIn(states=("Running",)), JobIdCompare(op="=", value=1)]),
]

BATCH_V2: list[tuple[str, list[Any]]] = [
    ("foo", [KeywordMatch(word="foo", exact=False)]),
    ('"foo"', [KeywordMatch(word="foo", exact=True)]),
    ("batch_id > 10", [BatchIdCompare(op=">", value=10)]),
    ("batch_id == 10", [BatchIdCompare(op="=", value=10)]),
    ("user = alice", [UserIs(user="alice")]),
    ("user != alice", [UserIs(user="alice", negate=True)]),
    ("billing_project = p", [BillingProjectIs(billing_project="p")]),
    ("billing_project != p", [BillingProjectIs(billing_project="p", negate=True)]),
    ("state = success", [BatchStateIs(state="success")]),
    ("state != open", [BatchStateIs(state="open", negate=True)]),
    ("start_time >= 2024-01-01T00:00:00Z",
     [TimeCompare(field="start_time", op=">=", epoch_ms=JAN_1_2024_MS)]),
    ("end_time < 2024-01-01T00:00:00Z",
     [TimeCompare(field="end_time", op="<", epoch_ms=JAN_1_2024_MS)]),
    ("duration >= 60", [DurationCompare(op=">=", ms=60_000)]),
    ("cost < $$1.25", [CostCompare(op="<", value=Decimal("1.25"))]),
    ("team =~ gen", [AttributeMatch(key="team", op="=~", value="gen")]),
    ("job_id = 3", [AttributeMatch(key="job_id", op="=", value="3")]),
]


def _ids(cases: list[tuple[str, list[Any]]]) -> list[str]:
    return [repr(q) for q, _ in cases]


@pytest.mark.parametrize(("q", "expected"), JOB_V1, ids=_ids(JOB_V1))
def test_job_v1(q: str, expected: list[Any]) -> None:
    assert parse_job_query(q, 1) == expected


@pytest.mark.parametrize(("q", "expected"), BATCH_V1, ids=_ids(BATCH_V1))
def test_batch_v1(q: str, expected: list[Any]) -> None:
    assert parse_batch_query(q, 1, user="me") == expected


@pytest.mark.parametrize(("q", "expected"), JOB_V2, ids=_ids(JOB_V2))
def test_job_v2(q: str, expected: list[Any]) -> None:
    assert parse_job_query(q, 2) == expected


@pytest.mark.parametrize(("q", "expected"), BATCH_V2, ids=_ids(BATCH_V2))
def test_batch_v2(q: str, expected: list[Any]) -> None:
    assert parse_batch_query(q, 2, user="me") == expected


def test_several_statements_are_anded_in_order() -> None:
    q = "state = running\nname =~ x\nduration > 2"
    assert parse_job_query(q, 2) == [
        JobStateIn(states=("Running",)),
        AttributeMatch(key="name", op="=~", value="x"),
        DurationCompare(op=">", ms=2000),
    ]


@pytest.mark.parametrize("version", [1, 2])
def test_no_q_means_my_batches(version: int) -> None:
    assert parse_batch_query(None, version, user="me") == [UserIs(user="me")]  # type: ignore[arg-type]
    assert default_batch_query("me") == [UserIs(user="me")]
    assert parse_batch_query("", version, user="me") == []  # type: ignore[arg-type]


# (kind, version, q, exact message)
ERRORS: list[tuple[str, int, str, str]] = [
    ("job", 1, "nonsense", "Invalid search term: nonsense."),
    ("job", 1, "!", "Invalid search term: ."),
    ("job", 1, "job_id=x", "expected int, but found x"),
    ("batch", 1, "user", "Invalid search term: user."),
    ("batch", 1, "live", "Invalid search term: live."),
    ("job", 2, "a b", 'could not parse term "a b"'),
    ("job", 2, "a = b = c", 'could not parse term "a = b = c"'),
    ("job", 2, "state = running\n\nfoo", 'could not parse term ""'),
    ("batch", 2, "a b c d", 'could not parse term "a b c d"'),
    ("job", 2, "job_id = x", "expected int, but found x"),
    ("job", 2, "job_id = 1.5", "expected int, but found 1.5"),
    ("job", 2, "exit_code = zero", "expected int, but found zero"),
    ("job", 2, f"job_id = {2**63}", f"expected int, but found {2**63}"),
    ("batch", 2, "batch_id > ten", "expected int, but found ten"),
    ("job", 2, "duration > soon", "expected float, but found soon"),
    ("job", 2, "duration > nan", "expected float, but found nan"),
    ("job", 2, "duration > inf", "expected float, but found inf"),
    ("job", 2, "duration > 1e400", "expected float, but found 1e400"),
    ("job", 2, "cost > $x", "expected float, but found x"),
    ("batch", 2, "cost > cheap", "expected float, but found cheap"),
    ("job", 2, "start_time > yesterday", "expected date, but found yesterday"),
    ("batch", 2, "end_time < 2024-13-01", "expected date, but found 2024-13-01"),
    ("job", 2, "state = nope", 'unknown state "nope"'),
    ("job", 2, "state = Running", 'unknown state "Running"'),
    ("batch", 2, "state = live", 'unknown state "live"'),
    ("job", 2, "state =~ run", "unexpected operator \"=~\" expected one of {'!=', '=', '=='}"),
    ("batch", 2, "user > a", "unexpected operator \">\" expected one of {'!=', '=', '=='}"),
    ("batch", 2, "billing_project !~ a",
     "unexpected operator \"!~\" expected one of {'!=', '=', '=='}"),
    ("job", 2, "exit_code < NULL", "unexpected operator \"<\" expected one of {'!=', '=', '=='}"),
    ("job", 2, "instance > a",
     "unexpected operator \">\" expected one of {'!=', '!~', '=', '==', '=~'}"),
    ("job", 2, "name <= a",
     "unexpected operator \"<=\" expected one of {'!=', '!~', '=', '==', '=~'}"),
    ("job", 2, "cost =~ 1",
     "unexpected operator \"=~\" expected one of {'!=', '<', '<=', '=', '==', '>', '>='}"),
    ("batch", 2, "a is b", "unknown operator is"),
    ("job", 2, '"a', 'expected a string of minimum length 3. Found "a'),
    ("job", 2, '""', 'expected a string of minimum length 3. Found ""'),
    ("batch", 2, '"abc', "expected the last character of the string to be '\"'"),
    ("job", 2, 'abc"', "expected the last character of the string to not be '\"'"),
]


@pytest.mark.parametrize(("kind", "version", "q", "message"), ERRORS,
                         ids=[f"{k}-v{v}-{q!r}" for k, v, q, _ in ERRORS])
def test_errors(kind: str, version: int, q: str, message: str) -> None:
    with pytest.raises(QueryError) as info:
        if kind == "job":
            parse_job_query(q, version)  # type: ignore[arg-type]
        else:
            parse_batch_query(q, version, user="me")  # type: ignore[arg-type]
    assert str(info.value) == message
    assert info.value.message == message
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, BadRequest)
    assert info.value.status == 400


def test_unknown_version() -> None:
    with pytest.raises(QueryError, match="unknown query version 3"):
        parse_job_query("", 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "f"),
    [(2, HasAttribute(key="k")), (2, AttributeMatch(key="k", op="=", value="v", negate=True)),
     (2, AttributeMatch(key="state", op="=", value="v")), (1, JobIdCompare(op="<", value=1)),
     (1, CostCompare(op="<", value=Decimal(1))), (2, KeywordMatch(word="a b", exact=True)),
     (2, KeywordMatch(word='a"', exact=False)),
     (1, AttributeMatch(key="job_id", op="=", value="1"))],
    ids=repr,
)
def test_render_refuses_what_would_not_parse_back(version: int, f: AnyFilter) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        render_query([f], version)  # type: ignore[arg-type]


# Hypothesis: render then reparse is the identity, and no text raises anything but QueryError.

_word = st.text(alphabet="abcxyz0123456789-.:/", min_size=1, max_size=8).filter(
    lambda w: w not in FIELD_NAMES
)
_compare = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
_match = st.sampled_from(["=", "!=", "=~", "!~"])
_ms = st.integers(min_value=-(10**13), max_value=253_402_300_799_999)
_cost = st.decimals(min_value=-(10**6), max_value=10**6, places=6, allow_nan=False,
                    allow_infinity=False)
_state_words = st.sampled_from(sorted(JOB_STATE_WORDS))

_shared_v2 = st.one_of(
    st.builds(AttributeMatch, key=_word, op=_match, value=_word),
    st.builds(KeywordMatch, word=_word, exact=st.booleans()),
    st.builds(TimeCompare, field=st.sampled_from(["start_time", "end_time"]), op=_compare,
              epoch_ms=_ms),
    st.builds(DurationCompare, op=_compare, ms=st.integers(-(10**12), 10**12)),
    st.builds(CostCompare, op=_compare, value=_cost),
)
_job_v2 = st.one_of(
    _shared_v2,
    st.builds(JobStateIn, states=_state_words.map(JOB_STATE_WORDS.__getitem__),
              negate=st.booleans()),
    st.builds(JobIdCompare, op=_compare, value=st.integers(-(2**63), 2**63 - 1)),
    st.builds(ExitCodeCompare, op=_compare, value=st.integers(-255, 255)),
    st.builds(ExitCodeCompare, op=st.sampled_from(["=", "!="]), value=st.none()),
    st.builds(InstanceMatch, op=_match, value=_word),
    st.builds(InstanceCollectionMatch, op=_match, value=_word),
)
_batch_v2 = st.one_of(
    _shared_v2,
    st.builds(UserIs, user=_word, negate=st.booleans()),
    st.builds(BillingProjectIs, billing_project=_word, negate=st.booleans()),
    st.builds(BatchStateIs, state=st.sampled_from(BATCH_STATE_WORDS), negate=st.booleans()),
    st.builds(BatchIdCompare, op=_compare, value=st.integers(0, 2**62)),
)
_v1_key = _word.filter(lambda w: w != "job_id" and ":" not in w)
_shared_v1 = st.one_of(
    st.builds(AttributeMatch, key=_v1_key, op=st.just("="), value=_word, negate=st.booleans()),
    st.builds(HasAttribute, key=_word, negate=st.booleans()),
)
_job_v1 = st.one_of(
    _shared_v1,
    st.builds(JobStateIn, states=_state_words.map(JOB_STATE_WORDS.__getitem__),
              negate=st.booleans()),
    st.builds(JobIdCompare, op=st.just("="), value=st.integers(0, 2**31), negate=st.booleans()),
)
_batch_v1 = st.one_of(
    _shared_v1,
    st.builds(UserIs, user=_word, negate=st.booleans()),
    st.builds(BillingProjectIs, billing_project=_word, negate=st.booleans()),
    st.builds(BatchStateIs, state=st.sampled_from(BATCH_STATE_WORDS), negate=st.booleans()),
)


@given(st.lists(_job_v2, max_size=6))
def test_job_v2_render_round_trips(filters: list[Any]) -> None:
    assert parse_job_query(render_query(filters, 2), 2) == filters


@given(st.lists(_batch_v2, max_size=6))
def test_batch_v2_render_round_trips(filters: list[Any]) -> None:
    assert parse_batch_query(render_query(filters, 2), 2, user="me") == filters


@given(st.lists(_job_v1, max_size=6))
def test_job_v1_render_round_trips(filters: list[Any]) -> None:
    assert parse_job_query(render_query(filters, 1), 1) == filters


@given(st.lists(_batch_v1, max_size=6))
def test_batch_v1_render_round_trips(filters: list[Any]) -> None:
    assert parse_batch_query(render_query(filters, 1), 1, user="me") == filters


_query_text = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.one_of(st.sampled_from(["=", "==", "!=", "<", ">", "<=", ">=", "=~", "!~", "!", '"',
                                   "$", " ", "\n", "has:", "user:", "state", "job_id",
                                   "exit_code", "cost", "duration", "start_time", "NULL",
                                   "live", "1e9", "-0", "2024-01-01", "nan"]),
                  st.text(max_size=4)),
        max_size=12,
    ).map("".join),
)


@given(_query_text, st.sampled_from([1, 2]))
def test_any_text_parses_or_raises_query_error(q: str, version: int) -> None:
    for parse in (lambda: parse_job_query(q, version),  # type: ignore[arg-type]
                  lambda: parse_batch_query(q, version, user="me")):  # type: ignore[arg-type]
        try:
            filters = parse()
        except QueryError as e:
            assert e.message
        else:
            assert isinstance(filters, list)
