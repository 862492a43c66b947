"""Codec properties: every event round-trips in both formats; bad input is a clear error."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import codec
from schemas.base import AttemptResource, JobResources
from schemas.batch import BatchCreated, JobHead, JobHeadsSubmitted, JobRecord, JobsSubmitted
from schemas.control import BillingLimitSet
from schemas.envelope import BulkEnvelope, Envelope, HeadsEnvelope, full, wrap
from schemas.events import CURRENT_VERSIONS, EVENT_TYPES, EVENTS_BY_TAG, AnyEvent, tag_of
from schemas.execution import (
    NO_RESOURCES,
    RAW_VIEWS,
    JobScheduled,
    RawJobScheduled,
    decode_resources,
)
from schemas.upcast import UpcastError, upcast

from .strategies import for_struct

any_event: st.SearchStrategy[AnyEvent] = st.one_of([for_struct(cls) for cls in EVENT_TYPES])


@given(event=any_event, epoch=st.integers(0, 2**31), fmt=st.sampled_from(["msgpack", "json"]))
@settings(max_examples=400)
def test_every_event_round_trips(event: AnyEvent, epoch: int, fmt: codec.Format) -> None:
    env = wrap(event, event_id="e", time_ms=1, producer_epoch=epoch)
    data = codec.encode(env, fmt)
    assert codec.detect(data) == fmt
    assert codec.decode(data) == env


def test_tags_are_explicit_and_unique() -> None:
    tags = [tag_of(cls) for cls in EVENT_TYPES]
    assert len(tags) == len(set(tags))
    for tag in tags:
        assert "." in tag and tag == tag.lower(), tag
        assert not tag.startswith(("schemas", "core")), "class paths are never tags"


def test_batch_events_are_keyed_by_batch_id() -> None:
    assert BatchCreated(batch_id=42, user="u", billing_project="b", token="t").key() == "42"


def test_decimal_stays_exact() -> None:
    env = wrap(BillingLimitSet(billing_project="p", limit=Decimal("0.1")), event_id="e", time_ms=0)
    assert json.loads(codec.encode_json(env))["event"]["limit"] == "0.1"
    assert codec.decode(codec.encode(env)).event.limit == Decimal("0.1")  # type: ignore[union-attr]


def _json_env(**overrides: Any) -> bytes:
    env = wrap(BatchCreated(batch_id=1, user="u", billing_project="b", token="t"),
               event_id="e", time_ms=0)
    raw = json.loads(codec.encode_json(env))
    for k, v in overrides.items():
        raw[k] = v
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty message"),
        (b"\x01\x02", "not an envelope"),
        (b"{not json", "malformed json"),
        (_json_env(tag="no.such", event={"type": "no.such"}), "unknown event tag 'no.such'"),
        (_json_env(schema_version=99), "newer than"),
        (_json_env(event={"type": "batch.created", "batch_id": "x"}), "invalid 'batch.created'"),
        (_json_env(key="2"), "does not match the event's key"),
        (_json_env(tag="user.created"), "does not match event tag"),
    ],
    ids=["empty", "binary", "malformed", "unknown-tag", "future-version", "bad-field",
         "wrong-key", "tag-mismatch"],
)
def test_bad_bytes_are_clear_errors(data: bytes, message: str) -> None:
    with pytest.raises(codec.DecodeError, match=message):
        codec.decode(data)


def _head(job: JobRecord) -> JobHead:
    return JobHead(**{f: getattr(job, f) for f in JobHead.__struct_fields__})


@given(event=any_event, fmt=st.sampled_from(["msgpack", "json"]))
@settings(max_examples=300)
def test_heads_decode_drops_only_the_specs_of_a_bunch(event: AnyEvent,
                                                      fmt: codec.Format) -> None:
    env = wrap(event, event_id="e", time_ms=1)
    heads = codec.decode(codec.encode(env, fmt), heads=True)
    assert isinstance(heads, HeadsEnvelope)
    assert [getattr(heads, f) for f in Envelope.__struct_fields__ if f != "event"] == [
        getattr(env, f) for f in Envelope.__struct_fields__ if f != "event"]
    if isinstance(event, JobsSubmitted):
        assert type(heads.event) is JobHeadsSubmitted
        assert (heads.event.batch_id, heads.event.update_id) == (event.batch_id,
                                                                 event.update_id)
        assert all(type(j) is JobHead for j in heads.event.jobs)
        assert list(heads.event.jobs) == [_head(j) for j in event.jobs]
    else:
        assert heads.event == event


def test_a_bunch_is_a_bunch_of_heads() -> None:
    """Code that handles JobHeadsSubmitted handles the full event too (the writers' class)."""
    assert issubclass(JobsSubmitted, JobHeadsSubmitted) and issubclass(JobRecord, JobHead)
    assert tag_of(JobHeadsSubmitted) == tag_of(JobsSubmitted)
    assert JobHeadsSubmitted not in EVENT_TYPES  # never appended, never decoded by default


def test_old_version_is_upcast() -> None:
    """A v0 payload that named the user 'owner' is lifted by a registered upcaster."""
    env = wrap(BatchCreated(batch_id=1, user="u", billing_project="b", token="t"),
               event_id="e", time_ms=0)
    raw = json.loads(codec.encode_json(env))
    raw["schema_version"] = CURRENT_VERSIONS["batch.created"] - 1
    raw["event"]["owner"] = raw["event"].pop("user")

    def rename_owner(p: dict[str, Any]) -> dict[str, Any]:
        p["user"] = p.pop("owner")
        return p

    upcasters = {("batch.created", raw["schema_version"]): rename_owner}
    decoded = codec.decode(json.dumps(raw).encode(), upcasters)
    assert decoded == env
    heads = codec.decode(json.dumps(raw).encode(), upcasters, heads=True)
    assert isinstance(heads, HeadsEnvelope) and heads.event == env.event
    with pytest.raises(codec.DecodeError, match="no upcaster"):
        codec.decode(json.dumps(raw).encode(), {})


def test_upcast_chain_applies_in_order() -> None:
    steps = {("t", 1): lambda p: {**p, "a": 1}, ("t", 2): lambda p: {**p, "b": p["a"] + 1}}
    assert upcast("t", 1, {}, 3, steps) == {"a": 1, "b": 2}
    with pytest.raises(UpcastError):
        upcast("t", 4, {}, 3, steps)


@given(events=st.lists(st.tuples(any_event, st.sampled_from(["msgpack", "json"])),
                       max_size=6), heads=st.booleans())
@settings(max_examples=150)
def test_decoding_many_is_decoding_each(events: list[tuple[AnyEvent, codec.Format]],
                                        heads: bool) -> None:
    datas = [codec.encode(wrap(e, event_id=f"e{i}", time_ms=i), fmt)
             for i, (e, fmt) in enumerate(events)]
    assert codec.decode_many(datas, heads=heads) == [codec.decode(d, heads=heads)
                                                     for d in datas]


def test_decoding_many_upcasts_old_versions_and_names_what_it_cannot_decode() -> None:
    current = [codec.encode(wrap(BatchCreated(batch_id=b, user="u", billing_project="b",
                                              token="t"), event_id=f"e{b}", time_ms=b))
               for b in (1, 2)]
    old = msgspec.msgpack.decode(current[1])
    old["schema_version"] = CURRENT_VERSIONS["batch.created"] - 1
    old["event"]["owner"] = old["event"].pop("user")

    def rename_owner(p: dict[str, Any]) -> dict[str, Any]:
        p["user"] = p.pop("owner")
        return p

    mixed = [current[0], msgspec.msgpack.encode(old)]
    upcasters = {("batch.created", old["schema_version"]): rename_owner}
    assert codec.decode_many(mixed, upcasters) == [codec.decode(d) for d in current]
    with pytest.raises(codec.DecodeError, match="no upcaster"):
        codec.decode_many(mixed, {})
    with pytest.raises(codec.DecodeError, match="not an envelope"):
        codec.decode_many([current[0], b"\x01\x02"])


def test_envelope_rejects_mismatched_header() -> None:
    with pytest.raises(ValueError, match="does not match"):
        Envelope(event_id="e", tag="user.created", schema_version=1, time_ms=0, key="1",
                 event=BatchCreated(batch_id=1, user="u", billing_project="b", token="t"))


def test_every_class_in_registry_is_in_union() -> None:
    assert set(EVENTS_BY_TAG.values()) == set(EVENT_TYPES)
    assert all(isinstance(msgspec.inspect.type_info(c), msgspec.inspect.StructType)
               for c in EVENT_TYPES)


def _struct_types(t: msgspec.inspect.Type) -> Iterator[msgspec.inspect.StructType]:
    """Every struct type within ``t`` (fields, list items, unions, dict values...)."""
    if isinstance(t, msgspec.inspect.StructType):
        yield t
        for f in t.fields:
            yield from _struct_types(f.type)
    for name in ("item_type", "value_type", "key_type"):
        inner = getattr(t, name, None)
        if isinstance(inner, msgspec.inspect.Type):
            yield from _struct_types(inner)
    for inner in getattr(t, "types", ()) or ():
        if isinstance(inner, msgspec.inspect.Type):
            yield from _struct_types(inner)


def test_no_event_struct_is_tracked_by_the_cyclic_collector() -> None:
    """Events are trees of values (no cycles): no struct of an envelope is left for the
    collector, whose collections were half of the projector's decoding time when they were."""
    types = {t.cls for t in _struct_types(msgspec.inspect.type_info(Envelope))}
    assert {JobsSubmitted, JobRecord, JobResources} <= types
    assert [c.__name__ for c in types if c.__struct_config__.gc] == []
    record = JobRecord(job_id=1, job_group_id=0, parent_ids=[3], attributes={"name": "a"},
                       resources=JobResources(cores_mcpu=1, memory_bytes=1),
                       inst_coll="standard", spec="{}")
    env = codec.decode(codec.encode(wrap(JobsSubmitted(batch_id=1, update_id=1,
                                                       jobs=[record]), event_id="e", time_ms=1)))
    assert isinstance(env.event, JobsSubmitted)
    decoded = env.event.jobs[0]
    assert decoded == record
    assert not any(gc.is_tracked(s) for s in (env, env.event, decoded, decoded.resources))


@given(event=any_event)
@settings(max_examples=300)
def test_bulk_decode_leaves_only_resources_undecoded(event: AnyEvent) -> None:
    """A bulk lane's decode: SJ, MJS and MJC as views whose ``full()`` is the event itself;
    every other event as the heads decode gives it."""
    env = wrap(event, event_id="e", time_ms=1)
    data = codec.encode(env)
    (bulk,) = codec.decode_many([data], bulk=True)
    assert isinstance(bulk, BulkEnvelope)
    heads = codec.decode(data, heads=True)
    view = RAW_VIEWS.get(type(event))
    if view is None:
        assert bulk.event == heads.event and full(bulk) is bulk
    else:
        assert type(bulk.event) is view
        assert isinstance(bulk.event.resources, msgspec.Raw)
        assert full(bulk) == heads
        assert full(bulk).event == event


def test_the_views_are_their_events_but_for_resources() -> None:
    """A view keeps every field of its event, with its default, tag and version: an event
    that gains a field must give it to its view too."""
    for cls, view in RAW_VIEWS.items():
        fields = {f.name: (f.type, f.default) for f in msgspec.structs.fields(cls)}
        view_fields = {f.name: (f.type, f.default) for f in msgspec.structs.fields(view)}
        assert fields.keys() == view_fields.keys(), view.__name__
        assert {k: v for k, v in fields.items() if k != "resources"} == {
            k: v for k, v in view_fields.items() if k != "resources"}, view.__name__
        assert view_fields["resources"] == (msgspec.Raw, NO_RESOURCES)
        assert (tag_of(view), view.version, view.topic) == (tag_of(cls), cls.version, cls.topic)
        assert view not in EVENT_TYPES  # never appended, never decoded by default


def test_an_omitted_resource_list_is_an_empty_one() -> None:
    sj = JobScheduled(batch_id=1, job_id=2, attempt_id="a", instance_name="i",
                      inst_coll="standard", cores_mcpu=1000)
    (bulk,) = codec.decode_many([codec.encode(wrap(sj, event_id="e", time_ms=1))], bulk=True)
    assert isinstance(bulk.event, RawJobScheduled)
    assert bytes(bulk.event.resources) == b"\x90" and decode_resources(bulk.event.resources) == []
    assert full(bulk).event == sj


@pytest.mark.parametrize("resources", [b"\xc1", b"\x91\x81\xa8resource\xa1x", b"\x91\x05"],
                         ids=["not-msgpack", "no-quantity", "not-a-resource"])
def test_a_view_with_a_bad_resource_list_fails_when_made_full(resources: bytes) -> None:
    """The bulk decode skips the resources' check: ``full`` (or the fold) does it."""
    sj = RawJobScheduled(batch_id=1, job_id=2, attempt_id="a", instance_name="i",
                         inst_coll="standard", cores_mcpu=1000,
                         resources=msgspec.Raw(resources))
    with pytest.raises(msgspec.DecodeError):
        sj.full()


def test_no_struct_of_a_bulk_envelope_is_tracked_by_the_cyclic_collector() -> None:
    """A bulk lane holds a whole partition's envelopes with the collector paused: its views
    must stay untracked like the events, or the first collection after would scan them all."""
    types = {t.cls for t in _struct_types(msgspec.inspect.type_info(BulkEnvelope))}
    assert set(RAW_VIEWS.values()) <= types
    assert [c.__name__ for c in types if c.__struct_config__.gc] == []
    sj = JobScheduled(batch_id=1, job_id=2, attempt_id="a", instance_name="i",
                      inst_coll="standard", cores_mcpu=1000,
                      resources=[AttemptResource(resource="compute/1", quantity=5)])
    (env,) = codec.decode_many([codec.encode(wrap(sj, event_id="e", time_ms=1))], bulk=True)
    assert isinstance(env.event, RawJobScheduled)
    assert not any(gc.is_tracked(o) for o in (env, env.event, env.event.resources))


def _job(job_id: int, spec: str = "") -> JobRecord:
    return JobRecord(job_id=job_id, job_group_id=0, inst_coll="standard", spec=spec,
                     resources=JobResources(cores_mcpu=1000, memory_bytes=2**30,
                                            storage_gib=0))


def test_a_bunchs_specs_come_as_one_text_or_one_a_job() -> None:
    texts = ['{"job_id": 1, "x": [1, 2]}', '{"job_id":2,"y":"\\u00e9t\u00e9"}']
    whole = JobsSubmitted(batch_id=1, update_id=1, jobs=[_job(1), _job(2)],
                          specs=" [" + " ,\n".join(texts) + "] ")
    each = JobsSubmitted(batch_id=1, update_id=1, jobs=[_job(1, texts[0]), _job(2, texts[1])])
    assert whole.spec_texts() == each.spec_texts() == texts
    for event in (whole, each):
        for fmt in ("msgpack", "json"):
            back = codec.decode(codec.encode(wrap(event, event_id="e", time_ms=1), fmt))
            assert back.event == event
            assert back.event.spec_texts() == texts  # type: ignore[attr-defined]
    # A job without a text is not encoded with an empty one.
    assert b"spec" not in msgspec.msgpack.encode(_job(1))


@pytest.mark.parametrize(("specs", "message"), [
    ('[{"a": 1}]', "the bunch has 2 jobs but 1 specs"),
    ('{"a": 1}', "not a JSON array"),
    ("[{", "not a JSON array"),
])
def test_specs_that_do_not_match_the_jobs_are_an_error(specs: str, message: str) -> None:
    event = JobsSubmitted(batch_id=1, update_id=1, jobs=[_job(1), _job(2)], specs=specs)
    with pytest.raises(ValueError, match=message):
        event.spec_texts()
