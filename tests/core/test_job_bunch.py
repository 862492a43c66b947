"""The typed fast path gives what the key-by-key checks give, on generated bunches.

Each bunch is encoded as compact JSON (as the official client sends it, with orjson), so even
the records' spec texts must be equal; a bunch the checks refuse must be refused with the same
message.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import BadRequest
from core.job_bunch import _SPECS, _texts, _typed, job_records_json
from core.job_specs import _resolved, job_records, records_of
from core.resources import default_config
from schemas.batch import JobRecord

CONFIG = default_config()
KW: dict[str, Any] = dict(start_job_id=11, n_jobs=4, start_job_group_id=3, n_job_groups=2,
                          config=CONFIG, known_group=lambda g: g in (0, 1, 3, 4), batch_id=7)

ints = st.one_of(st.integers(-2, 6), st.just(True), st.just(1.0), st.just(2**70))
int_lists = st.one_of(st.lists(st.integers(-1, 14), max_size=3), st.just([True]),
                      st.just(["1"]), st.just(3))
strs = st.one_of(st.sampled_from(["", "x", "ubuntu:24.04", "é"]), st.just(1), st.none())
str_lists = st.one_of(st.lists(st.sampled_from(["true", "echo", "us-central1"]), max_size=2),
                      st.just([1]), st.just("true"))
bools = st.one_of(st.booleans(), st.just(0), st.just("true"))
resources = st.one_of(
    st.fixed_dictionaries({}, optional={"cpu": st.sampled_from(["1", "0.25", "3", "lots"]),
                                        "memory": st.sampled_from(["standard", "4Gi", "lowmem"]),
                                        "storage": st.sampled_from(["10Gi", "1Ti"]),
                                        "preemptible": st.booleans()}),
    st.just([]), st.just({"gpus": 1}))
pairs = st.lists(st.fixed_dictionaries({"from": st.just("gs://b/x"), "to": strs},
                                       optional={"extra": st.just(1)}), min_size=1, max_size=2)
env = st.lists(st.fixed_dictionaries({"name": st.just("A"), "value": strs},
                                     optional={"extra": st.just(1)}), min_size=1, max_size=2)
docker = st.fixed_dictionaries(
    {"type": st.sampled_from(["docker", "docker", "jvm", "dock"])},
    optional={"image": strs, "command": str_lists,
              "mount_docker_socket": st.one_of(st.booleans(), st.none(), st.just(1)),
              "user": st.just("root")})
OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "always_run": bools, "always_copy_output": bools, "n_max_attempts": ints,
    "absolute_parent_ids": int_lists, "in_update_parent_ids": int_lists,
    "parent_ids": int_lists, "absolute_job_group_id": ints, "in_update_job_group_id": ints,
    "attributes": st.one_of(st.dictionaries(st.sampled_from(["name", "k"]), strs, max_size=2),
                            st.just([])),
    "resources": resources, "regions": str_lists, "env": env, "input_files": pairs,
    "output_files": pairs, "timeout": st.sampled_from([1, 2.5, 0]),
    "network": st.sampled_from(["public", "private"]), "unconfined": bools,
    "mount_tokens": bools, "port": ints, "surprise": st.just(1)}


@st.composite
def spec(draw: st.DrawFn, job_id: int) -> dict[str, Any]:
    out: dict[str, Any] = {"job_id": draw(st.one_of(st.just(job_id), ints)),
                           "process": draw(docker)}
    for key in draw(st.lists(st.sampled_from(sorted(OPTIONAL)), max_size=6, unique=True)):
        out[key] = draw(st.one_of(OPTIONAL[key], st.none()))
    if draw(st.booleans()):
        del out["job_id"]
    return out


@st.composite
def bunch(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 4))
    return [draw(spec(i + 1)) for i in range(n)]


def outcome(fn: Any, arg: Any) -> list[JobRecord] | str:
    try:
        return list(fn(arg, **KW))
    except BadRequest as e:
        return f"400 {e.message}"


@settings(max_examples=600)
@given(bunch())
def test_the_fast_path_gives_what_the_checks_give(objs: list[dict[str, Any]]) -> None:
    data = msgspec.json.encode(objs)
    assert outcome(job_records_json, data) == outcome(job_records, objs)


def without_texts(fn: Any) -> Any:
    return lambda arg, **kw: fn(arg, texts=False, **kw)


def textless(out: list[JobRecord] | str) -> list[JobRecord] | str:
    return out if isinstance(out, str) else [msgspec.structs.replace(r, spec="") for r in out]




VALID: dict[str, st.SearchStrategy[Any]] = {
    "always_run": st.booleans(), "always_copy_output": st.booleans(),
    "n_max_attempts": st.integers(1, 5), "absolute_parent_ids": st.lists(st.integers(1, 12)),
    "in_update_parent_ids": st.lists(st.integers(1, 3), max_size=2),
    "absolute_job_group_id": st.sampled_from([0, 1, 3]),
    "in_update_job_group_id": st.sampled_from([1, 2]),
    "attributes": st.dictionaries(st.sampled_from(["name", "k"]), st.text(max_size=3)),
    "resources": st.fixed_dictionaries({}, optional={"cpu": st.sampled_from(["1", "0.5"]),
                                                     "memory": st.sampled_from(["standard",
                                                                                "4Gi"])}),
    "regions": st.just(["us-central1"]),
    "env": st.lists(st.fixed_dictionaries({"name": st.text(max_size=2),
                                           "value": st.text(max_size=2)}), max_size=2),
    "input_files": st.lists(st.fixed_dictionaries({"from": st.just("gs://b/x"),
                                                   "to": st.just("/io/x")}), max_size=1)}


@st.composite
def valid_bunch(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        s: dict[str, Any] = {"job_id": i + 1, "process": {
            "type": "docker", "image": draw(st.text(max_size=3)),
            "command": draw(st.lists(st.text(max_size=3), max_size=2))}}
        for key in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=5, unique=True)):
            s[key] = draw(VALID[key])
        if "absolute_job_group_id" in s:
            s.pop("in_update_job_group_id", None)
        out.append(s)
    return out


@settings(max_examples=300)
@given(valid_bunch())
def test_the_fast_path_gives_what_the_checks_give_on_mostly_valid_bunches(
        objs: list[dict[str, Any]]) -> None:
    data = msgspec.json.encode(objs)
    assert _typed(data) is not None  # every one of these takes the fast path
    assert outcome(job_records_json, data) == outcome(job_records, objs)


@st.composite
def nearly_valid_bunch(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A valid bunch with one value of one spec replaced by anything the strategies give."""
    objs = draw(valid_bunch())
    target = objs[draw(st.integers(0, len(objs) - 1))]
    where = draw(st.sampled_from(["spec", "process"]))
    if where == "spec":
        key = draw(st.sampled_from([*sorted(OPTIONAL), "job_id"]))
        target[key] = draw(st.one_of(OPTIONAL.get(key, ints), st.none()))
    else:
        key = draw(st.sampled_from(["type", "image", "command", "mount_docker_socket", "x"]))
        target["process"][key] = draw(st.one_of(strs, str_lists, bools, st.none()))
    return objs


@settings(max_examples=1500)
@given(nearly_valid_bunch())
def test_the_fast_path_gives_what_the_checks_give_on_nearly_valid_bunches(
        objs: list[dict[str, Any]]) -> None:
    data = msgspec.json.encode(objs)
    assert outcome(job_records_json, data) == outcome(job_records, objs)


@given(st.lists(st.sampled_from(
    [{"job_id": 1, "process": {"type": "docker", "image": "u", "command": ["true"]},
      "attributes": {"name": "a"}, "always_run": False, "in_update_job_group_id": 1,
      "absolute_parent_ids": [], "in_update_parent_ids": []}]), min_size=1, max_size=3))
def test_ordinary_bunches_take_the_fast_path_and_keep_the_clients_text(
        objs: list[dict[str, Any]]) -> None:
    objs = [{**o, "job_id": i + 1} for i, o in enumerate(objs)]
    data = b"[" + b", ".join(msgspec.json.encode(o) for o in objs) + b"]"  # spaces between
    assert _typed(data) is not None
    records = job_records_json(data, **KW)
    assert [r.spec for r in records] == [msgspec.json.encode(o).decode() for o in objs]
    assert [r.job_id for r in records] == list(range(11, 11 + len(objs)))


def test_a_body_that_is_not_json_is_a_decode_error_and_no_body_is_no_list() -> None:
    with pytest.raises(msgspec.DecodeError):
        job_records_json(b"[{", **KW)
    assert outcome(job_records_json, b"") == "400 jobs is not a list"
    too_many = msgspec.json.encode([{"job_id": 1}] * 1025)
    assert outcome(job_records_json, too_many) == outcome(job_records, [{"job_id": 1}] * 1025)


def test_the_decoded_spec_structs_are_not_tracked_by_the_cyclic_collector() -> None:
    """Thousands per bunch, trees of values: left to reference counting (see schemas/base)."""
    specs = _SPECS.decode(msgspec.json.encode([{
        "job_id": 1, "process": {"type": "docker", "image": "u", "command": ["true"]},
        "env": [{"name": "A", "value": "1"}], "input_files": [{"from": "a", "to": "b"}]}]))
    (s,) = specs
    assert s.env is not None and s.input_files is not None
    assert not any(gc.is_tracked(x) for x in (s, s.process, s.env[0], s.input_files[0]))


ALIKE: dict[str, st.SearchStrategy[Any]] = {
    "always_run": st.booleans(), "n_max_attempts": st.integers(1, 5),
    "attributes": st.dictionaries(st.sampled_from(["name", "k"]), st.text(max_size=3)),
    "absolute_parent_ids": st.just([]), "in_update_parent_ids": st.just([]),
    "env": st.lists(st.fixed_dictionaries({"name": st.just("A"), "value": st.text(max_size=2)}),
                    max_size=1)}
ALIKE_GROUPS = st.sampled_from([{}, {"in_update_job_group_id": 1},
                                {"in_update_job_group_id": 2}, {"in_update_job_group_id": 5},
                                {"absolute_job_group_id": 0}, {"absolute_job_group_id": 4},
                                {"absolute_job_group_id": 9}])


@st.composite
def alike_bunch(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Specs that all join one group (perhaps one that does not exist) with no parents,
    resources or regions; sometimes one of them then differs in one of those."""
    group = draw(ALIKE_GROUPS)
    out = []
    for i in range(draw(st.integers(1, 4))):
        s: dict[str, Any] = {"job_id": i + 1, **group, "process": {
            "type": "docker", "image": "u", "command": ["true"]}}
        for key in draw(st.lists(st.sampled_from(sorted(ALIKE)), max_size=4, unique=True)):
            s[key] = draw(ALIKE[key])
        out.append(s)
    if draw(st.booleans()):
        target = out[draw(st.integers(0, len(out) - 1))]
        target.pop("in_update_job_group_id", None)
        target.pop("absolute_job_group_id", None)
        target.update(draw(st.one_of(
            ALIKE_GROUPS, st.just({"absolute_parent_ids": [1]}),
            st.just({"in_update_parent_ids": [1]}), st.just({"regions": ["us-central1"]}),
            st.just({"resources": {"cpu": "0.5"}}), st.just({"resources": {"cpu": "lots"}}))))
    return out


def job_by_job(specs: Any, texts: list[str]) -> list[JobRecord]:
    return _resolved(specs, texts, **{k: v for k, v in KW.items() if k != "n_jobs"})


@settings(max_examples=600)
@given(st.one_of(alike_bunch(), valid_bunch()))
def test_a_bunch_of_alike_jobs_gives_what_resolving_each_job_gives(
        objs: list[dict[str, Any]]) -> None:
    data = msgspec.json.encode(objs)
    specs = _typed(data)
    assert specs is not None
    texts = _texts(data)
    assert outcome(lambda _, **kw: records_of(specs, texts, **kw), None) == \
        outcome(lambda _, **kw: job_by_job(specs, texts), None)


@settings(max_examples=300)
@given(st.one_of(bunch(), alike_bunch(), valid_bunch()))
def test_without_texts_the_records_are_the_same_but_their_spec(
        objs: list[dict[str, Any]]) -> None:
    """Ingest asks for no texts (it keeps the body): the fast path and the checks then give
    the same records, the same errors, each record's spec empty and not encoded."""
    data = msgspec.json.encode(objs)
    with_texts = outcome(job_records_json, data)
    assert outcome(without_texts(job_records_json), data) == textless(with_texts)
    assert outcome(without_texts(job_records), objs) == textless(outcome(job_records, objs))
    if not isinstance(with_texts, str):
        bare = outcome(without_texts(job_records_json), data)
        assert isinstance(bare, list)
        assert all(b"spec" not in msgspec.msgpack.encode(r) for r in bare)
