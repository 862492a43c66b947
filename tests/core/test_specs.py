from __future__ import annotations

import contextlib
import copy
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import BadRequest, DomainError
from core.job_specs import job_records
from core.resources import default_config
from core.specs import (
    MAX_BUNCH_SIZE,
    BatchSpec,
    UpdateSpec,
    job_group_records,
    parse_batch_spec,
    parse_create_fast,
    parse_update_fast,
    parse_update_spec,
)
from schemas.base import JobResources
from schemas.batch import JobGroupRecord

CONFIG = default_config()
MI = 1024**2

# What hailtop 0.2.139's aioclient sends (captured from Batch._batch_spec / _job_group_specs /
# _job_specs): a first update with two nested groups and four jobs.
CLIENT_BATCH = {"billing_project": "test", "n_jobs": 4, "n_job_groups": 2, "token": "tok",
                "attributes": {"name": "b"}, "cancel_after_n_failures": 2}
CLIENT_GROUPS = [
    {"job_group_id": 1, "attributes": {"name": "g"}, "cancel_after_n_failures": 1,
     "in_update_parent_id": 0},
    {"job_group_id": 2, "in_update_parent_id": 1},
]
_BASE = {"always_run": False, "n_max_attempts": 20, "always_copy_output": False}
CLIENT_JOBS: list[dict[str, Any]] = [
    {**_BASE, "job_id": 1, "absolute_parent_ids": [], "in_update_parent_ids": [],
     "process": {"command": ["echo", "hi"], "image": "ubuntu:22.04", "type": "docker"},
     "in_update_job_group_id": 0},
    {"always_run": True, "n_max_attempts": 3, "always_copy_output": True, "job_id": 2,
     "absolute_parent_ids": [], "in_update_parent_ids": [1],
     "process": {"command": ["/bin/bash", "-c", "true"], "image": "ubuntu:22.04",
                 "type": "docker"},
     "in_update_job_group_id": 1, "env": [{"name": "A", "value": "1"}], "port": 5000,
     "resources": {"cpu": "0.25", "memory": "lowmem", "storage": "10Gi"}, "timeout": 30.5,
     "attributes": {"name": "two"}, "input_files": [{"from": "gs://a/b", "to": "/io/b"}],
     "output_files": [{"from": "/io/c", "to": "gs://a/c"}],
     "cloudfuse": [{"bucket": "bucket", "mount_path": "/mnt/b", "read_only": True}],
     "requester_pays_project": "proj", "mount_tokens": True, "network": "public",
     "user_code": "print(1)", "regions": ["local"]},
    {**_BASE, "job_id": 3, "absolute_parent_ids": [], "in_update_parent_ids": [1, 2],
     "process": {"command": ["true"], "image": "ubuntu:22.04", "type": "docker"},
     "in_update_job_group_id": 2,
     "resources": {"machine_type": "n1-standard-4", "preemptible": False}},
    {**_BASE, "job_id": 4, "absolute_parent_ids": [], "in_update_parent_ids": [],
     "process": {"type": "jvm", "jar_spec": {"type": "jar_url", "value": "gs://x/y.jar"},
                 "command": ["is.hail.Main"], "profile": True},
     "in_update_job_group_id": 0, "resources": {"cpu": "2", "memory": "highmem"}},
]
# A later update of batch 7 (jobs 1-3 exist, group 1 exists): what the client sends then.
CLIENT_UPDATE_GROUPS = [{"job_group_id": 1, "attributes": {"name": "g"}, "absolute_parent_id": 1}]
CLIENT_UPDATE_JOBS = [
    {**_BASE, "job_id": 1, "absolute_parent_ids": [3], "in_update_parent_ids": [],
     "process": {"command": ["true"], "image": "ubuntu:22.04", "type": "docker"},
     "absolute_job_group_id": 0},
    {**_BASE, "job_id": 2, "absolute_parent_ids": [3], "in_update_parent_ids": [1],
     "process": {"command": ["true"], "image": "ubuntu:22.04", "type": "docker"},
     "in_update_job_group_id": 1, "resources": {"cpu": "1", "memory": "4Gi", "storage": "5Gi"}},
]


def jobs(objs: Any, **overrides: Any) -> list[Any]:
    kwargs: dict[str, Any] = dict(start_job_id=1, n_jobs=4, start_job_group_id=1, n_job_groups=2,
                                  config=CONFIG, known_group=lambda g: g in (1, 2))
    kwargs.update(overrides)
    return job_records(objs, **kwargs)


def job(**fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"job_id": 1, "process": {"type": "docker", "image": "ubuntu",
                                                     "command": ["true"]}}
    spec.update(fields)
    return spec


# --- batches and updates ---------------------------------------------------------------------


def test_client_batch_spec() -> None:
    assert parse_batch_spec(CLIENT_BATCH) == BatchSpec(
        billing_project="test", token="tok", n_jobs=4, n_job_groups=2,
        attributes={"name": "b"}, cancel_after_n_failures=2)


def test_minimal_batch_spec_with_nulls() -> None:
    spec = parse_batch_spec({"billing_project": "bp", "n_jobs": 0, "token": "t",
                             "attributes": None, "callback": None,
                             "cancel_after_n_failures": None})
    assert spec == BatchSpec(billing_project="bp", token="t", n_jobs=0)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "batch is not an object"),
        ({"n_jobs": 1, "token": "t"}, "batch missing required key billing_project."),
        ({"billing_project": "b", "n_jobs": 1}, "batch missing required key token."),
        ({"billing_project": "b", "token": "t"}, "batch missing required key n_jobs."),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "zz": 1, "aa": 2},
         "unknown keys in batch: {'aa', 'zz'}"),
        ({"billing_project": 1, "n_jobs": 1, "token": "t"},
         "batch.billing_project is not a string"),
        ({"billing_project": "b", "n_jobs": "1", "token": "t"}, "batch.n_jobs is not an integer"),
        ({"billing_project": "b", "n_jobs": True, "token": "t"}, "batch.n_jobs is not an integer"),
        ({"billing_project": "b", "n_jobs": -1, "token": "t"},
         "batch.n_jobs does not satisfy the condition x >= 0"),
        ({"billing_project": "b", "n_jobs": 1, "n_job_groups": -1, "token": "t"},
         "batch.n_job_groups does not satisfy the condition x >= 0"),
        ({"billing_project": "b", "n_jobs": 1, "token": 5}, "batch.token is not a string"),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "attributes": {"a": 1}},
         "batch.attributes[a] is not a string"),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "attributes": []},
         "batch.attributes is not an object"),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "callback": 1},
         "batch.callback is not a string"),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "cancel_after_n_failures": 0},
         "batch.cancel_after_n_failures does not satisfy the condition x > 0"),
        ({"billing_project": "b", "n_jobs": 1, "token": "t", "cancel_after_n_failures": 1.5},
         "batch.cancel_after_n_failures is not an integer"),
    ],
    ids=lambda v: repr(v)[:60],
)
def test_batch_spec_errors(obj: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse_batch_spec(obj)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [({"n_jobs": 4, "n_job_groups": 2, "token": "t"}, UpdateSpec(4, 2, "t")),
     ({"n_jobs": 4, "token": "t"}, UpdateSpec(4, 0, "t")),
     ({"n_jobs": 0, "n_job_groups": 1, "token": "t"}, UpdateSpec(0, 1, "t"))],
    ids=str,
)
def test_update_spec(obj: Any, expected: UpdateSpec) -> None:
    assert parse_update_spec(obj) == expected


@pytest.mark.parametrize(
    ("obj", "message"),
    [({"token": "t"}, "batch_update missing required key n_jobs."),
     ({"n_jobs": 1}, "batch_update missing required key token."),
     ({"n_jobs": 1, "token": "t", "billing_project": "b"},
      "unknown keys in batch_update: {'billing_project'}"),
     ({"n_jobs": -2, "token": "t"}, "batch_update.n_jobs does not satisfy the condition x >= 0"),
     ({"n_jobs": 1, "n_job_groups": "2", "token": "t"},
      "batch_update.n_job_groups is not an integer")],
    ids=str,
)
def test_update_spec_errors(obj: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse_update_spec(obj)


def test_fast_bodies() -> None:
    batch, groups, bunch = parse_create_fast(
        {"bunch": CLIENT_JOBS, "job_groups": CLIENT_GROUPS, "batch": CLIENT_BATCH})
    assert batch.n_jobs == 4 and groups == CLIENT_GROUPS and bunch == CLIENT_JOBS
    update, groups, bunch = parse_update_fast(
        {"job_groups": [], "bunch": CLIENT_UPDATE_JOBS,
         "update": {"n_jobs": 2, "n_job_groups": 0, "token": "u"}})
    assert update == UpdateSpec(2, 0, "u") and groups == [] and bunch == CLIENT_UPDATE_JOBS
    _, groups, _ = parse_create_fast({"bunch": [], "batch": CLIENT_BATCH})
    assert groups == []


@pytest.mark.parametrize(
    ("parse", "obj", "message"),
    [(parse_create_fast, {"batch": CLIENT_BATCH}, "body missing required key bunch."),
     (parse_create_fast, {"bunch": [], "batch": CLIENT_BATCH, "x": 1}, "unknown keys in body"),
     (parse_update_fast, {"bunch": [], "batch": CLIENT_BATCH}, "unknown keys in body"),
     (parse_update_fast, {"bunch": {}, "update": {"n_jobs": 1, "token": "t"}},
      "bunch is not a list"),
     (parse_create_fast, {"bunch": [{}] * 1000, "job_groups": [{}] * 25, "batch": CLIENT_BATCH},
      f"bunch has 1025 specs; a bunch holds at most {MAX_BUNCH_SIZE}")],
    ids=["missing-bunch", "unknown-key", "batch-in-update", "bunch-not-list", "too-many"],
)
def test_fast_body_errors(parse: Any, obj: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse(obj)


# --- job groups ------------------------------------------------------------------------------


def depths(known: dict[int, int]) -> Any:
    return known.get


def test_client_job_groups_first_update() -> None:
    records = job_group_records(CLIENT_GROUPS, start_job_group_id=1, n_job_groups=2,
                                depth_of=depths({0: 0}))
    assert records == [
        JobGroupRecord(job_group_id=1, parent_id=0, attributes={"name": "g"},
                       cancel_after_n_failures=1),
        JobGroupRecord(job_group_id=2, parent_id=1),
    ]


def test_client_job_groups_later_update() -> None:
    records = job_group_records(CLIENT_UPDATE_GROUPS, start_job_group_id=3, n_job_groups=1,
                                depth_of=depths({0: 0, 1: 1, 2: 2}))
    assert records == [JobGroupRecord(job_group_id=3, parent_id=1, attributes={"name": "g"})]


def test_job_groups_in_a_second_bunch_see_the_first() -> None:
    # Bunch 2 of an update starting at 5: group 6 (in-update 2) under group 5 (in-update 1).
    records = job_group_records([{"job_group_id": 2, "in_update_parent_id": 1, "callback": "u"}],
                                start_job_group_id=5, n_job_groups=2,
                                depth_of=depths({0: 0, 5: 1}))
    assert records == [JobGroupRecord(job_group_id=6, parent_id=5, callback="u")]


def group(gid: int, **parent: int) -> dict[str, Any]:
    return {"job_group_id": gid, **parent}


@pytest.mark.parametrize(
    ("objs", "start", "n", "known", "message"),
    [
        ({}, 1, 1, {0: 0}, "job_groups is not a list"),
        ([group(1, in_update_parent_id=0)] * (MAX_BUNCH_SIZE + 1), 1, 2000, {0: 0},
         "job_groups has 1025 specs; a bunch holds at most 1024"),
        ([group(0, in_update_parent_id=0)], 1, 1, {0: 0},
         "job group ids [0] are out of range: the update reserved 1 job group (id 1)"),
        ([group(1, absolute_parent_id=0), group(3, absolute_parent_id=0)], 1, 2, {0: 0},
         "job group ids [3] are out of range: the update reserved 2 job groups (ids 1 to 2)"),
        ([group(1, absolute_parent_id=0), group(3, absolute_parent_id=0)], 1, 3, {0: 0},
         "noncontiguous job group ids found in the spec: 1 -> 3"),
        ([group(1, absolute_parent_id=0), group(1, absolute_parent_id=0)], 1, 3, {0: 0},
         "noncontiguous job group ids found in the spec: 1 -> 1"),
        ([group(1)], 1, 1, {0: 0},
         "job_groups[0] must have exactly one of absolute_parent_id and in_update_parent_id"),
        ([group(1, absolute_parent_id=0, in_update_parent_id=0)], 1, 1, {0: 0},
         "job_groups[0] must have exactly one of absolute_parent_id and in_update_parent_id"),
        ([{"job_group_id": 1, "absolute_parent_id": 0, "name": "x"}], 1, 1, {0: 0},
         "unknown keys in job_groups[0]: {'name'}"),
        ([{"absolute_parent_id": 0}], 1, 1, {0: 0},
         "job_groups[0] missing required key job_group_id."),
        ([group(1, absolute_parent_id=0) | {"cancel_after_n_failures": 0}], 1, 1, {0: 0},
         "job_groups[0].cancel_after_n_failures does not satisfy the condition x > 0"),
        ([group(1, absolute_parent_id=0) | {"attributes": {"k": 2}}], 1, 1, {0: 0},
         "job_groups[0].attributes[k] is not a string"),
        ([group(1, absolute_parent_id="0")], 1, 1, {0: 0},  # type: ignore[arg-type]
         "job_groups[0].absolute_parent_id is not an integer"),
        ([group(1, absolute_parent_id=4)], 3, 1, {0: 0, 1: 1},
         "job group parent 4 does not exist"),
        ([group(1, absolute_parent_id=2)], 3, 1, {0: 0, 1: 1},
         "job group parent 2 does not exist"),
        ([group(1, absolute_parent_id=-1)], 1, 1, {0: 0}, "job group parent -1 does not exist"),
        ([group(1, in_update_parent_id=1)], 1, 1, {0: 0},
         "job_groups[0].in_update_parent_id is 1: it must name an earlier job group of this "
         "update (1 to 0), or 0 for the root job group"),
        ([group(1, in_update_parent_id=0)], 4, 1, {0: 0, 3: 1},
         "job_groups[0].in_update_parent_id is 0: it must name an earlier job group of this "
         "update (1 to 0)"),
        ([group(1, in_update_parent_id=0), group(2, in_update_parent_id=1),
          group(3, in_update_parent_id=2)], 1, 3, {0: 0},
         "job group exceeded the maximum level of nesting"),
        ([group(1, absolute_parent_id=2)], 3, 1, {0: 0, 1: 1, 2: 2},
         "job group exceeded the maximum level of nesting"),
    ],
    ids=lambda v: repr(v)[:50],
)
def test_job_group_errors(objs: Any, start: int, n: int, known: dict[int, int],
                          message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        job_group_records(objs, start_job_group_id=start, n_job_groups=n, depth_of=depths(known))


def test_two_levels_below_the_root_are_allowed() -> None:
    records = job_group_records(
        [group(1, in_update_parent_id=0), group(2, in_update_parent_id=1)],
        start_job_group_id=1, n_job_groups=2, depth_of=depths({0: 0}))
    assert [r.parent_id for r in records] == [0, 1]


# --- jobs ------------------------------------------------------------------------------------


def test_client_jobs_first_update() -> None:
    records = jobs(CLIENT_JOBS, batch_id=1)
    assert [(r.job_id, r.job_group_id, r.parent_ids) for r in records] == [
        (1, 0, []), (2, 1, [1]), (3, 2, [1, 2]), (4, 0, [])]
    one, two, three, four = records
    assert one.inst_coll == "standard" and one.n_max_attempts == 20 and not one.always_run
    assert one.resources == JobResources(cores_mcpu=1000, memory_bytes=3840 * MI)
    assert two.always_run and two.n_max_attempts == 3 and two.attributes == {"name": "two"}
    assert two.inst_coll == "highcpu"
    assert two.resources == JobResources(cores_mcpu=250, memory_bytes=231 * MI, storage_gib=10,
                                         regions=["local"])
    assert three.inst_coll == "job-private" and three.resources.machine_type == "n1-standard-4"
    assert not three.resources.preemptible
    assert four.inst_coll == "highmem" and four.resources.cores_mcpu == 2000
    for record, sent in zip(records, CLIENT_JOBS, strict=True):
        assert msgspec.json.decode(record.spec) == sent


def test_client_jobs_later_update() -> None:
    records = jobs(CLIENT_UPDATE_JOBS, start_job_id=4, n_jobs=2, start_job_group_id=3,
                   n_job_groups=1, known_group=lambda g: g in (1, 2, 3))
    assert [(r.job_id, r.job_group_id, r.parent_ids) for r in records] == [
        (4, 0, [3]), (5, 3, [3, 4])]
    # 4Gi fits one highmem core (6.5Gi), cheaper than two standard ones.
    assert records[1].inst_coll == "highmem"
    assert records[1].resources == JobResources(cores_mcpu=1000, memory_bytes=6656 * MI,
                                                storage_gib=10)


def test_legacy_parent_ids_and_defaults() -> None:
    [record] = jobs([job(job_id=2, parent_ids=[1], attributes={"name": "x"})], n_jobs=2)
    assert record.parent_ids == [1] and record.job_group_id == 0 and record.attributes == {
        "name": "x"}


def test_spec_is_the_json_sent() -> None:
    spec = job(env=[{"name": "B", "value": "2"}], timeout=None)
    [record] = jobs([spec])
    assert record.spec == msgspec.json.encode(spec).decode()
    assert list(msgspec.json.decode(record.spec)) == list(spec)  # key order kept


@pytest.mark.parametrize(
    "spec",
    [job(network="private"), job(unconfined=True),
     job(secrets=[{"namespace": "default", "name": "s", "mount_path": "/s"}]),
     job(service_account={"namespace": "default", "name": "ci-agent"})],
    ids=["network", "unconfined", "secrets", "service_account"],
)
def test_developer_only_features(spec: dict[str, Any]) -> None:
    assert len(jobs([spec], is_developer=True)) == 1
    with pytest.raises(BadRequest, match="unauthorized"):
        jobs([spec])


DOCKER = {"type": "docker", "image": "ubuntu", "command": ["true"]}
JVM = {"type": "jvm", "jar_spec": {"type": "jar_url", "value": "gs://j.jar"}, "command": ["m"]}


@pytest.mark.parametrize(
    ("objs", "message"),
    [
        ({}, "jobs is not a list"),
        ([job()] * 1025, "jobs has 1025 specs; a bunch holds at most 1024"),
        (["x"], "jobs[0] is not an object"),
        ([{"process": DOCKER}], "jobs[0] missing required key job_id."),
        ([{"job_id": 1}], "jobs[0] missing required key process."),
        ([job(foo=1, image="x")], "unknown keys in jobs[0]: {'foo', 'image'}"),
        ([job(job_id=None)], "jobs[0].job_id is not an integer"),
        ([job(job_id=5)], "job ids [5] are out of range: the update reserved 4 jobs (ids 1 to 4)"),
        ([job(job_id=0), job(job_id=5)], "job ids [0, 5] are out of range"),
        ([job(job_id=1), job(job_id=3)], "noncontiguous job ids found in the spec: 1 -> 3"),
        ([job(job_id=2), job(job_id=2)], "noncontiguous job ids found in the spec: 2 -> 2"),
        ([job(process=None)], "jobs[0].process is not an object"),
        ([job(process={"image": "x", "command": []})],
         "jobs[0].process missing required key type."),
        ([job(process={"type": "shell"})],
         "jobs[0].process.type must be one of: ['docker', 'jvm']"),
        ([job(process={"type": "docker", "command": ["x"]})],
         "jobs[0].process missing required key image."),
        ([job(process={**DOCKER, "command": "echo hi"})], "jobs[0].process.command is not a list"),
        ([job(process={**DOCKER, "command": [1]})], "jobs[0].process.command[0] is not a string"),
        ([job(process={**DOCKER, "mount_docker_socket": True})],
         "mount_docker_socket is no longer supported but was set to True in request. "
         "Please upgrade."),
        ([job(process={**DOCKER, "profile": True})],
         "unknown keys in jobs[0].process: {'profile'}"),
        ([job(process={**JVM, "jar_spec": {"type": "git_revision", "value": "abc"}})],
         "revision must be 40 character hexadecimal encoded SHA-1, got: abc"),
        ([job(process={**JVM, "jar_spec": {"type": "url", "value": "x"}})],
         "jobs[0].process.jar_spec.type must be one of: ['git_revision', 'jar_url']"),
        ([job(process={**JVM, "profile": "yes"})], "jobs[0].process.profile is not a boolean"),
        ([job(process=JVM, resources={"cpu": "0.5"})],
         "invalid cpu for jvm jobs. must be 1, 2, 4, or 8"),
        ([job(process=JVM, resources={"memory": "lowmem"})],
         "jvm jobs cannot be on lowmem machines"),
        ([job(process=JVM, resources={"machine_type": "n1-standard-4"})],
         "jvm jobs may not specify machine_type"),
        ([job(job_id=2, in_update_parent_ids=[2])],
         "parent job ids [2] are out of range: a parent of job 2 must be an earlier job"),
        ([job(job_id=2, absolute_parent_ids=[0, 3])], "parent job ids [0, 3] are out of range"),
        ([job(job_id=2, parent_ids=[-1])], "parent job ids [-1] are out of range"),
        ([job(job_id=2, absolute_parent_ids=[1], in_update_parent_ids=[1])],
         "bunch contains job with duplicated parents: job 2 names [1] more than once"),
        ([job(job_id=2, absolute_parent_ids=[1, 1])], "duplicated parents"),
        ([job(absolute_parent_ids="1")], "jobs[0].absolute_parent_ids is not a list"),
        ([job(absolute_job_group_id=0, in_update_job_group_id=1)],
         "jobs[0] must not have both absolute_job_group_id and in_update_job_group_id"),
        ([job(in_update_job_group_id=3)],
         "jobs[0].in_update_job_group_id 3 of job 1 is out of range"),
        ([job(absolute_job_group_id=9)], "job 1: job group 9 does not exist"),
        ([job(absolute_job_group_id=-1)], "job 1: job group -1 does not exist"),
        ([job(always_run=1)], "jobs[0].always_run is not a boolean"),
        ([job(n_max_attempts=0)], "jobs[0].n_max_attempts does not satisfy the condition x > 0"),
        ([job(attributes={"name": 1})], "jobs[0].attributes[name] is not a string"),
        ([job(env=[{"name": "A"}])], "jobs[0].env[0] missing required key value."),
        ([job(env=[{"name": "A", "value": 1}])], "jobs[0].env[0].value is not a string"),
        ([job(env={"A": "1"})], "jobs[0].env is not a list"),
        ([job(input_files=[{"from": "a"}])], "jobs[0].input_files[0] missing required key to."),
        ([job(output_files=[["a", "b"]])], "jobs[0].output_files[0] is not an object"),
        ([job(cloudfuse=[{"bucket": "b", "mount_path": "/m", "read_only": False}])],
         "Only read-only cloudfuse requests are supported. Found {'bucket': 'b', "
         "'mount_path': '/m', 'read_only': False}"),
        ([job(cloudfuse=[{"bucket": "b", "mount_path": "/io", "read_only": True}])],
         "Cloudfuse requests with mount_path=/io are not supported."),
        ([job(cloudfuse=[{"bucket": "", "mount_path": "/m", "read_only": True}])],
         "jobs[0].cloudfuse[0].bucket must not be empty"),
        ([job(timeout=0)], "jobs[0].timeout does not satisfy the condition x > 0"),
        ([job(timeout="10")], "jobs[0].timeout is not numeric"),
        ([job(timeout=True)], "jobs[0].timeout is not numeric"),
        ([job(timeout=-(10**400))], "jobs[0].timeout does not satisfy the condition x > 0"),
        ([job(regions=[])], "regions must not be an empty array"),
        ([job(regions=["mars"])], "invalid regions specified: {'mars'}. Choose from {'local'}"),
        ([job(regions="local")], "jobs[0].regions is not a list"),
        ([job(network="internal")], "jobs[0].network must be one of: ['private', 'public']"),
        ([job(network="private")], "unauthorized network private"),
        ([job(unconfined=True)], "unauthorized use of unconfined=True"),
        ([job(secrets=[{"namespace": "default", "name": "s", "mount_path": "/s"}])],
         "unauthorized secret [('default', 's')]"),
        ([job(secrets=[{"namespace": "Bad_NS", "name": "s", "mount_path": "/s"}])],
         "jobs[0].secrets[0].namespace is not a valid Kubernetes name"),
        ([job(service_account={"namespace": "default", "name": "sa"})],
         "unauthorized service account ('default', 'sa')"),
        ([job(service_account={"name": "sa"})],
         "jobs[0].service_account missing required key namespace."),
        ([job(port="80")], "jobs[0].port is not an integer"),
        ([job(user_code=3)], "jobs[0].user_code is not a string"),
        ([job(requester_pays_project=[])], "jobs[0].requester_pays_project is not a string"),
        ([job(mount_tokens="true")], "jobs[0].mount_tokens is not a boolean"),
        ([job(always_copy_output=0)], "jobs[0].always_copy_output is not a boolean"),
        ([job(resources={"cpu": "3"})],
         "bad resource request for job (9, 1): cpu must be a power of two with a min of 0.25; "
         "found 3."),
        ([job(resources={"cpu": "64"})],
         "resource requests for job (9, 1) are unsatisfiable: cloud=local, cpu=64, "
         "memory=standard, storage=0Gi, preemptible=True, machine_type=None"),
        ([job(resources={"gpu": 1})], "unknown keys in jobs[0].resources: {'gpu'}"),
        ([job(resources=[])], "jobs[0].resources is not an object"),
    ],
    ids=lambda v: repr(v)[:70],
)
def test_job_errors(objs: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)) as info:
        jobs(objs, batch_id=9)
    assert info.value.status == 400


def test_a_bunch_wholly_out_of_range_lists_ten_ids_and_counts_them() -> None:
    """A client that sends a second bunch's 1,024 jobs to an update of 1,024 hears which ids
    and how many in a message of one line, not 1,024 numbers."""
    bunch = [job(job_id=i) for i in range(1025, 2049)]
    with pytest.raises(BadRequest) as info:
        jobs(bunch, n_jobs=1024)
    assert info.value.message == (
        "job ids [1025, 1026, 1027, 1028, 1029, 1030, 1031, 1032, 1033, 1034, ...] are out of "
        "range (1024 in all): the update reserved 1024 jobs (ids 1 to 1024)")


def test_an_update_of_no_jobs_says_so() -> None:
    with pytest.raises(BadRequest, match=re.escape(
            "job ids [1] are out of range: the update reserved no jobs")):
        jobs([job(job_id=1)], n_jobs=0)


def test_many_bad_parents_are_listed_ten_and_counted() -> None:
    bad = list(range(100, 130))
    with pytest.raises(BadRequest) as info:
        jobs([job(job_id=1, absolute_parent_ids=bad)])
    assert info.value.message.startswith(
        "parent job ids [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, ...] are out of "
        "range (30 in all): a parent of job 1 must be an earlier job")


def test_root_group_zero_only_in_the_first_group_range() -> None:
    assert jobs([job(in_update_job_group_id=0)])[0].job_group_id == 0
    with pytest.raises(BadRequest, match="in_update_job_group_id 0 of job 1 is out of range"):
        jobs([job(in_update_job_group_id=0)], start_job_group_id=3, n_job_groups=1)


# --- properties --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
JOB_KEYS = ["job_id", "process", "absolute_parent_ids", "in_update_parent_ids", "parent_ids",
            "absolute_job_group_id", "in_update_job_group_id", "always_run", "n_max_attempts",
            "attributes", "env", "resources", "input_files", "output_files", "cloudfuse",
            "timeout", "regions", "network", "unconfined", "user_code", "port", "secrets",
            "service_account", "requester_pays_project", "mount_tokens", "always_copy_output"]


@st.composite
def mutated_client_bunch(draw: st.DrawFn) -> list[Any]:
    """A client bunch with a few values replaced by arbitrary JSON."""
    bunch = copy.deepcopy(CLIENT_JOBS)
    for _ in range(draw(st.integers(1, 3))):
        spec = draw(st.sampled_from(bunch))
        spec[draw(st.sampled_from(JOB_KEYS))] = draw(json_values)
    return bunch


def _outcome(objs: Any) -> str:
    """The records (their spec text aside: it is the JSON as sent, keys in order), or the error."""
    try:
        return repr([msgspec.structs.replace(r, spec="") for r in jobs(objs)])
    except DomainError as e:
        return f"{type(e).__name__}: {e}"


@given(bunch=mutated_client_bunch(), data=st.data())
def test_the_key_order_of_a_spec_does_not_change_its_outcome(bunch: list[Any],
                                                           data: st.DataObject) -> None:
    """Checks run in the spec's key order and fall back to their own order on an error: a
    spec with several faults gets the same message whatever order its keys come in."""
    shuffled = [dict(data.draw(st.permutations(list(spec.items())))) if isinstance(spec, dict)
                else spec for spec in bunch]
    assert _outcome(shuffled) == _outcome(bunch)


def test_of_two_faults_the_first_in_check_order_is_reported() -> None:
    faults = {"always_run": "yes", "attributes": [1]}  # always_run is checked first
    for spec in (job(**faults), job(**dict(reversed(list(faults.items()))))):
        with pytest.raises(BadRequest, match=re.escape("jobs[0].always_run is not a boolean")):
            jobs([spec])


@given(objs=json_values | st.lists(json_values, max_size=3) | mutated_client_bunch(),
       developer=st.booleans())
def test_job_records_only_raise_domain_errors(objs: Any, developer: bool) -> None:
    try:
        records = jobs(objs, is_developer=developer)
    except DomainError:
        return
    assert all(1 <= r.job_id <= 4 and all(p < r.job_id for p in r.parent_ids) for r in records)


@given(objs=json_values | st.lists(json_values | st.dictionaries(
    st.sampled_from(["job_group_id", "absolute_parent_id", "in_update_parent_id", "attributes",
                     "callback", "cancel_after_n_failures"]), json_values), max_size=3),
       start=st.integers(1, 4))
def test_job_group_records_only_raise_domain_errors(objs: Any, start: int) -> None:
    try:
        records = job_group_records(objs, start_job_group_id=start, n_job_groups=3,
                                    depth_of=depths({0: 0, 1: 1, 2: 2, 3: 1}))
    except DomainError:
        return
    assert all(0 <= r.parent_id < r.job_group_id for r in records)


@given(obj=json_values | st.dictionaries(
    st.sampled_from(["billing_project", "n_jobs", "n_job_groups", "token", "attributes",
                     "callback", "cancel_after_n_failures"]), json_values))
def test_batch_and_update_specs_only_raise_domain_errors(obj: Any) -> None:
    for parse in (parse_batch_spec, parse_update_spec, parse_create_fast, parse_update_fast):
        with contextlib.suppress(DomainError):
            parse(obj)


@given(data=st.data(), n=st.integers(1, 30), start=st.integers(1, 1000))
def test_in_update_parents_resolve_to_earlier_jobs(data: st.DataObject, n: int,
                                                   start: int) -> None:
    parents = [data.draw(st.sets(st.integers(1, i - 1), max_size=3)) if i > 1 else set()
               for i in range(1, n + 1)]
    specs = [job(job_id=i, in_update_parent_ids=sorted(ps))
             for i, ps in enumerate(parents, start=1)]
    records = jobs(specs, start_job_id=start, n_jobs=n)
    assert [r.job_id for r in records] == list(range(start, start + n))
    for record, ps in zip(records, parents, strict=True):
        assert record.parent_ids == sorted(start + p - 1 for p in ps)


_REQUESTS = [None, {"cpu": "1"}, {"cpu": "0.25", "memory": "lowmem"}, {"cpu": "2"},
             {"memory": "4Gi", "cpu": "1"}, {"cpu": "1", "memory": "4Gi"},
             {"machine_type": "n1-standard-4", "preemptible": False}]


@given(st.lists(st.tuples(st.sampled_from(range(len(_REQUESTS))),
                          st.sampled_from([None, ["local"], ["elsewhere"]])),
                min_size=1, max_size=12))
def test_a_bunch_normalizes_resources_as_each_job_alone(picks: list[tuple[int, Any]]) -> None:
    """Jobs asking for the same resources share one normalization: the records are what each
    job gives when submitted alone."""
    specs = [job(job_id=i + 1, resources=_REQUESTS[r], regions=regions)
             for i, (r, regions) in enumerate(picks)]

    def alone(i: int) -> tuple[Any, ...]:
        try:
            (record,) = jobs([{**specs[i], "job_id": 1}], start_job_id=i + 1, n_jobs=1,
                             batch_id=7)
        except BadRequest as e:
            return ("error", str(e))
        return (record.resources, record.inst_coll)

    expected = [alone(i) for i in range(len(specs))]
    failing = [e for e in expected if e[0] == "error"]
    try:
        together = jobs(specs, n_jobs=len(specs), batch_id=7)
    except BadRequest as e:  # the first failing job's own error
        assert failing and str(e) == failing[0][1]
        return
    assert not failing
    assert [(r.resources, r.inst_coll) for r in together] == expected


def test_a_failing_request_names_its_own_job_after_the_same_request_of_others() -> None:
    ok = {"cpu": "1"}
    bad = {"cpu": "64"}
    with pytest.raises(BadRequest, match=r"jobs\[2\]|\(7, 3\)") as caught:
        jobs([job(job_id=1, resources=ok), job(job_id=2, resources=ok),
              job(job_id=3, resources=bad)], n_jobs=3, batch_id=7)
    assert "(7, 1)" not in str(caught.value) and "(7, 2)" not in str(caught.value)
