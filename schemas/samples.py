"""One sample envelope of every tag: the source of the golden files.

Golden files under ``tests/schemas/golden/`` are written once, from here, and then never changed:
they pin what old producers wrote. ``python -m schemas.samples DIR`` writes the files of tags that
have none yet and leaves existing ones alone.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

from schemas.base import AttemptResource, JobResources
from schemas.batch import (
    BatchCancelled,
    BatchCancelRequested,
    BatchCompleted,
    BatchCreated,
    BatchDeleted,
    JobGroupCancelled,
    JobGroupCancelRequested,
    JobGroupCompleted,
    JobGroupRecord,
    JobGroupsSubmitted,
    JobRecord,
    JobsSubmitted,
    UpdateCommitted,
    UpdateOpened,
)
from schemas.codec import encode_json
from schemas.control import (
    BillingLimitSet,
    BillingProjectClosed,
    BillingProjectCreated,
    BillingProjectDeleted,
    BillingProjectMemberAdded,
    BillingProjectMemberRemoved,
    BillingProjectReopened,
    ResourceRateSet,
    ServiceFreezeSet,
    TokenIssued,
    TokenRevoked,
    UserCreated,
    UserDeleted,
    WaitingReason,
    WaitingReasonsChanged,
)
from schemas.envelope import Envelope, wrap
from schemas.events import AnyEvent
from schemas.execution import (
    AttemptHeartbeat,
    AttemptLost,
    CompletedAttempt,
    JobCancelled,
    JobCompleted,
    JobsCancelled,
    JobScheduled,
    JobsCompleted,
    JobsScheduled,
    JobStarted,
    JobUnschedulable,
    ScheduledAttempt,
)
from schemas.infra import (
    InstanceActivated,
    InstanceCreated,
    InstanceDeactivated,
    InstanceDeleted,
    InstanceRequested,
    LogMarker,
    SchedulerElected,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_RES = [
    AttemptResource(resource="compute/n1-preemptible/1", quantity=1000),
    AttemptResource(resource="memory/n1-preemptible/1", quantity=3840),
    AttemptResource(resource="service-fee/1", quantity=1000),
]
_SPEC = '{"job_id":1,"process":{"type":"docker","image":"ubuntu:24.04","command":["true"]}}'


def sample_events() -> list[AnyEvent]:
    """One event of every tag, with every field set to a realistic value."""
    return [
        UserCreated(user="alice", login_id="alice@example.org", is_developer=True),
        UserDeleted(user="mallory"),
        TokenIssued(user="alice", token_id="tok-1", token_sha256="0" * 64,
                    expires_at_ms=T0 + 86_400_000),
        TokenRevoked(user="alice", token_id="tok-1"),
        BillingProjectCreated(billing_project="genomics"),
        BillingProjectClosed(billing_project="genomics"),
        BillingProjectReopened(billing_project="genomics"),
        BillingProjectDeleted(billing_project="old-project"),
        BillingProjectMemberAdded(billing_project="genomics", user="alice"),
        BillingProjectMemberRemoved(billing_project="genomics", user="mallory"),
        BillingLimitSet(billing_project="genomics", limit=Decimal("1000.50")),
        ResourceRateSet(resource="compute/n1-preemptible/1", rate=Decimal("0.00000000000278")),
        BatchCreated(batch_id=7, user="alice", billing_project="genomics", token="tkn-7",
                     attributes={"name": "align"}, callback="http://127.0.0.1:9/cb",
                     cancel_after_n_failures=3),
        UpdateOpened(batch_id=7, update_id=1, token="upd-1", n_jobs=2, n_job_groups=1,
                     start_job_id=1, start_job_group_id=1),
        JobGroupsSubmitted(batch_id=7, update_id=1, job_groups=[
            JobGroupRecord(job_group_id=1, parent_id=0, attributes={"name": "stage-1"},
                           callback=None, cancel_after_n_failures=1)]),
        JobsSubmitted(batch_id=7, update_id=1, jobs=[
            JobRecord(job_id=1, job_group_id=1, parent_ids=[], always_run=False,
                      n_max_attempts=20, inst_coll="standard",
                      resources=JobResources(cores_mcpu=1000, memory_bytes=3_840 * 2**20,
                                             storage_gib=10, regions=["us-central1"]),
                      attributes={"name": "a"}, spec=_SPEC),
            JobRecord(job_id=2, job_group_id=1, parent_ids=[1], always_run=True,
                      n_max_attempts=3, inst_coll="job-private",
                      resources=JobResources(cores_mcpu=16000, memory_bytes=60 * 2**30,
                                             machine_type="n1-highmem-16", preemptible=False),
                      attributes={}, spec=_SPEC.replace('"job_id":1', '"job_id":2')),
        ]),
        UpdateCommitted(batch_id=7, update_id=1, n_jobs=2, n_job_groups=1),
        BatchCancelRequested(batch_id=7, requested_by="alice", reason="user"),
        BatchCancelled(batch_id=7, reason="billing_limit"),
        JobGroupCancelRequested(batch_id=7, job_group_id=1, requested_by="alice"),
        JobGroupCancelled(batch_id=7, job_group_id=1, reason="n_failures"),
        BatchDeleted(batch_id=7, requested_by="alice"),
        BatchCompleted(batch_id=7, outcome="failure", n_jobs=2, n_succeeded=1, n_failed=1,
                       n_cancelled=0, time_completed_ms=T0 + 60_000),
        JobGroupCompleted(batch_id=7, job_group_id=1, outcome="success", n_jobs=2,
                          n_succeeded=2, n_failed=0, n_cancelled=0,
                          time_completed_ms=T0 + 60_000),
        JobScheduled(batch_id=7, job_id=1, attempt_id="a1b2c3", instance_name="worker-std-0001",
                     inst_coll="standard", cores_mcpu=1000),
        JobStarted(batch_id=7, job_id=1, attempt_id="a1b2c3", instance_name="worker-std-0001",
                   start_time_ms=T0 + 1_000, resources=_RES),
        JobCompleted(batch_id=7, job_id=1, attempt_id="a1b2c3", instance_name="worker-std-0001",
                     state="Failed", exit_code=1, error=None, start_time_ms=T0 + 1_000,
                     end_time_ms=T0 + 31_000, resources=_RES,
                     status='{"container_statuses":{"main":{"container_status":'
                            '{"exit_code":1,"out_of_memory":false}}}}'),
        AttemptHeartbeat(batch_id=7, job_id=1, attempt_id="a1b2c3",
                         instance_name="worker-std-0001", rollup_time_ms=T0 + 21_000),
        AttemptLost(batch_id=7, job_id=1, attempt_id="a1b2c3", instance_name="worker-std-0001",
                    reason="preempted", end_time_ms=T0 + 25_000),
        JobCancelled(batch_id=7, job_id=2, reason="parent_failed"),
        JobUnschedulable(batch_id=7, job_id=2, reason="needs 16000 mCPU; largest worker has 4000",
                         permanent=True),
        SchedulerElected(epoch=3, scheduler_id="scheduler-b"),
        InstanceRequested(instance_name="worker-std-0001", inst_coll="standard",
                          machine_type="n1-standard-4", region="us-central1", cores_mcpu=4000,
                          preemptible=True),
        InstanceCreated(instance_name="worker-std-0001", inst_coll="standard"),
        InstanceActivated(instance_name="worker-std-0001", address="127.0.0.1:5001",
                          cores_mcpu=4000),
        InstanceDeactivated(instance_name="worker-std-0001", reason="idle"),
        InstanceDeleted(instance_name="worker-std-0001", reason="idle"),
        LogMarker(marker_id="m-0", kafka_partition=0),
        # New samples go at the end: a sample's id and time come from its position.
        ServiceFreezeSet(frozen=True, reason="database maintenance"),
        WaitingReasonsChanged(epoch=3, entries=[
            WaitingReason(user="alice", inst_coll="standard", reason="fair_share",
                          message="fair share: other users hold the rest of the free standard "
                                  "cores", since_ms=T0 + 40_000),
            WaitingReason(user="alice", inst_coll="standard", batch_id=7, job_id=1,
                          reason="region", message="no standard instance in the job's regions "
                                                   "(us-central1)", since_ms=T0 + 40_000),
            WaitingReason(user="bob", inst_coll="highmem"),
        ]),
        JobsScheduled(batch_id=7, attempts=[
            ScheduledAttempt(job_id=1, attempt_id="d4e5f6", instance_name="worker-std-0001",
                             inst_coll="standard", cores_mcpu=1000, resources=_RES),
            ScheduledAttempt(job_id=2, attempt_id="0a1b2c", instance_name="worker-std-0002",
                             inst_coll="standard", cores_mcpu=1000),
        ]),
        JobsCompleted(batch_id=7, instance_name="worker-std-0001", attempts=[
            CompletedAttempt(job_id=1, attempt_id="d4e5f6", state="Success", exit_code=0,
                             start_time_ms=T0 + 1_000, end_time_ms=T0 + 1_040, resources=_RES,
                             status='{"state":"succeeded"}', start_reported=False),
            CompletedAttempt(job_id=3, attempt_id="0b1c2d", state="Error",
                             error="executable not found", end_time_ms=T0 + 1_050),
        ]),
        JobsCancelled(batch_id=7, job_ids=[4, 5, 9], reason="user"),
    ]


def sample_envelopes() -> list[Envelope]:
    """The samples, wrapped with fixed ids and times (scheduler events carry an epoch)."""
    out = []
    for i, event in enumerate(sample_events()):
        epoch = 3 if event.topic == "scheduler-events" or event.__struct_config__.tag in (
            "job.scheduled", "jobs.scheduled", "job.unschedulable",
            "scheduler.waiting_reasons") else 0
        out.append(wrap(event, event_id=f"{i:032x}", time_ms=T0 + i, producer_epoch=epoch))
    return out


def write_missing(directory: Path) -> list[Path]:
    """Write golden files for tags that have none; return the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for env in sample_envelopes():
        path = directory / f"{env.tag}.json"
        if not path.exists():
            path.write_bytes(encode_json(env) + b"\n")
            written.append(path)
    return written


if __name__ == "__main__":
    for p in write_missing(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/schemas/golden")):
        print("wrote", p)
