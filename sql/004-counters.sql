-- Counters: dynamic state kept apart from the static rows of 003, written by the projector.
-- Per-batch and per-job-group rows have a single writer (the batch's partition), so they are
-- plain rows. Counters shared across batches are TOKENIZED: a logical value is the SUM over its
-- token rows, and each projector partition writes its own token, so concurrent writers never
-- touch the same row. Usage is in the resource's unit times milliseconds (e.g. mCPU*ms); cost is
-- SUM(resource_usage * resources.rate). (`usage` is a reserved word, hence resource_usage.)

-- job_group_job_counts: job-state counts per job group, recursive over descendant groups (a job
-- counts in its group and every ancestor); group 0 is the whole batch. n_failed counts Failed
-- and Error jobs, as Hail reports them; n_completed = n_succeeded + n_failed + n_cancelled.
CREATE TABLE job_group_job_counts (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  n_jobs INT NOT NULL DEFAULT 0,
  n_pending INT NOT NULL DEFAULT 0,
  n_ready INT NOT NULL DEFAULT 0,
  n_creating INT NOT NULL DEFAULT 0,
  n_running INT NOT NULL DEFAULT 0,
  n_completed INT NOT NULL DEFAULT 0,
  n_succeeded INT NOT NULL DEFAULT 0,
  n_failed INT NOT NULL DEFAULT 0,
  n_errored INT NOT NULL DEFAULT 0,
  n_cancelled INT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_group_id)
) ENGINE=InnoDB;

-- batches_cancelled: a row means the batch is cancelled (batch.cancelled); the canceller and
-- reads test membership. Written by the projector.
CREATE TABLE batches_cancelled (
  batch_id BIGINT NOT NULL,
  reason VARCHAR(40) NOT NULL,
  time_cancelled_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id)
) ENGINE=InnoDB;

-- job_groups_cancelled: a row per cancelled group, one for each descendant of a cancelled
-- group too (job_group.cancelled, n_failures). Written by the projector.
CREATE TABLE job_groups_cancelled (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  reason VARCHAR(40) NOT NULL,
  time_cancelled_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_group_id)
) ENGINE=InnoDB;

-- user_inst_coll_resources (TOKENIZED): fair-share inputs per user and instance collection:
-- jobs and cores by state, and cancelled-but-not-yet-drained jobs. Written by the projector on
-- every job state change; cancellation subtracts a group's cancellable resources in O(1).
CREATE TABLE user_inst_coll_resources (
  user VARCHAR(100) NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  n_ready_jobs BIGINT NOT NULL DEFAULT 0,
  ready_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_running_jobs BIGINT NOT NULL DEFAULT 0,
  running_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_creating_jobs BIGINT NOT NULL DEFAULT 0,
  n_cancelled_ready_jobs BIGINT NOT NULL DEFAULT 0,
  n_cancelled_running_jobs BIGINT NOT NULL DEFAULT 0,
  n_cancelled_creating_jobs BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (user, inst_coll, token),
  INDEX user_inst_coll_resources_inst_coll (inst_coll)
) ENGINE=InnoDB;

-- job_group_inst_coll_cancellable_resources (TOKENIZED): ready/running/creating work per job
-- group and instance collection that a cancellation would remove from user_inst_coll_resources
-- (recursive over descendants, like the counts). Written by the projector.
CREATE TABLE job_group_inst_coll_cancellable_resources (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  n_ready_cancellable_jobs BIGINT NOT NULL DEFAULT 0,
  ready_cancellable_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_running_cancellable_jobs BIGINT NOT NULL DEFAULT 0,
  running_cancellable_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_creating_cancellable_jobs BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_group_id, inst_coll, token)
) ENGINE=InnoDB;

-- aggregated_job_resources: usage per job and resource (not tokenized: one writer per batch).
-- Written by the projector on job.started, attempt.heartbeat, job.completed, attempt.lost.
CREATE TABLE aggregated_job_resources (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  resource VARCHAR(100) NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_id, resource)
) ENGINE=InnoDB;

-- aggregated_job_group_resources (TOKENIZED): usage per job group, recursive over descendants
-- (a job's usage counts in its group and every ancestor; group 0 is the batch).
CREATE TABLE aggregated_job_group_resources (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  resource VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, job_group_id, resource, token)
) ENGINE=InnoDB;

-- aggregated_batch_resources (TOKENIZED): usage per batch.
CREATE TABLE aggregated_batch_resources (
  batch_id BIGINT NOT NULL,
  resource VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, resource, token)
) ENGINE=InnoDB;

-- aggregated_billing_project_resources (TOKENIZED): usage per billing project, for limits and
-- GET /billing_projects accrued_cost.
CREATE TABLE aggregated_billing_project_resources (
  billing_project VARCHAR(100) NOT NULL,
  resource VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_project, resource, token)
) ENGINE=InnoDB;

-- aggregated_billing_project_user_resources_by_date (TOKENIZED): usage per billing project,
-- user and UTC day the usage accrued, for GET /billing and 24 h quotas.
CREATE TABLE aggregated_billing_project_user_resources_by_date (
  billing_project VARCHAR(100) NOT NULL,
  user VARCHAR(100) NOT NULL,
  usage_date DATE NOT NULL,
  resource VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (billing_project, user, usage_date, resource, token),
  INDEX aggregated_bp_user_by_date_date (usage_date),
  INDEX aggregated_bp_user_by_date_user (user, usage_date)
) ENGINE=InnoDB;

-- aggregated_user_resources (TOKENIZED): usage per user across billing projects (quotas).
CREATE TABLE aggregated_user_resources (
  user VARCHAR(100) NOT NULL,
  resource VARCHAR(100) NOT NULL,
  token INT NOT NULL,
  resource_usage BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (user, resource, token)
) ENGINE=InnoDB;
