-- Batches, updates, job groups, jobs, attempts: the static rows of batch events, written by the
-- projector (one writer per batch: events of a batch share a partition). Dynamic state that is
-- updated in bulk (counts, cancellation, billing) lives in 004. Ids are absolute (ingest resolves
-- in-update ids). JSON is stored as MEDIUMTEXT. Times are BIGINT ms since the epoch.

-- batches: one row per batch, from batch.created; state/n_jobs/times from update.committed and
-- batch.completed; deleted from batch.deleted. state: open (no committed update yet), running,
-- complete. Listing filters by user or billing project, newest first.
CREATE TABLE batches (
  id BIGINT NOT NULL,
  user VARCHAR(100) NOT NULL,
  billing_project VARCHAR(100) NOT NULL,
  token VARCHAR(100) NOT NULL,
  attributes MEDIUMTEXT NULL,
  callback TEXT NULL,
  cancel_after_n_failures INT NULL,
  state ENUM('open', 'running', 'complete') NOT NULL DEFAULT 'open',
  n_jobs INT NOT NULL DEFAULT 0,
  n_job_groups INT NOT NULL DEFAULT 0,
  n_updates INT NOT NULL DEFAULT 0,
  time_created_ms BIGINT NOT NULL,
  time_closed_ms BIGINT NULL,
  time_completed_ms BIGINT NULL,
  deleted BOOLEAN NOT NULL DEFAULT FALSE,
  time_deleted_ms BIGINT NULL,
  PRIMARY KEY (id),
  UNIQUE INDEX batches_user_token (user, token),
  INDEX batches_user_id (user, id),
  INDEX batches_billing_project_id (billing_project, id),
  INDEX batches_state_id (state, id),
  INDEX batches_time_completed (time_completed_ms)
) ENGINE=InnoDB;

-- batch_attributes: one row per batch attribute, for `k=v` and `has:k` queries; written by the
-- projector from batch.created.
CREATE TABLE batch_attributes (
  batch_id BIGINT NOT NULL,
  attr_key VARCHAR(100) NOT NULL,
  attr_value TEXT NULL,
  PRIMARY KEY (batch_id, attr_key),
  INDEX batch_attributes_key_value (attr_key, attr_value(255))
) ENGINE=InnoDB;

-- batch_updates: each update reserves a block of job ids and job group ids; written by the
-- projector from batch.update_opened and batch.update_committed.
CREATE TABLE batch_updates (
  batch_id BIGINT NOT NULL,
  update_id INT NOT NULL,
  token VARCHAR(100) NULL,
  start_job_id INT NOT NULL,
  n_jobs INT NOT NULL,
  start_job_group_id INT NOT NULL,
  n_job_groups INT NOT NULL,
  committed BOOLEAN NOT NULL DEFAULT FALSE,
  time_created_ms BIGINT NOT NULL,
  time_committed_ms BIGINT NULL,
  PRIMARY KEY (batch_id, update_id),
  UNIQUE INDEX batch_updates_token (batch_id, token),
  INDEX batch_updates_start_job_id (batch_id, start_job_id),
  INDEX batch_updates_committed (batch_id, committed)
) ENGINE=InnoDB;

-- job_groups: one row per group; the root group 0 (no parent, update_id NULL) is created with
-- the batch. depth: 0 for the root. state: running or complete. Written by the projector from
-- batch.created, batch.job_groups_submitted, update.committed, job_group.completed. Listing
-- children pages by (batch_id, parent_id, job_group_id).
CREATE TABLE job_groups (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  update_id INT NULL,
  parent_id INT NULL,
  depth INT NOT NULL,
  attributes MEDIUMTEXT NULL,
  callback TEXT NULL,
  cancel_after_n_failures INT NULL,
  committed BOOLEAN NOT NULL DEFAULT FALSE,
  state ENUM('running', 'complete') NOT NULL DEFAULT 'running',
  n_jobs INT NOT NULL DEFAULT 0,
  time_created_ms BIGINT NOT NULL,
  time_completed_ms BIGINT NULL,
  PRIMARY KEY (batch_id, job_group_id),
  INDEX job_groups_parent (batch_id, parent_id, job_group_id),
  INDEX job_groups_update (batch_id, update_id)
) ENGINE=InnoDB;

-- job_group_self_and_ancestors: closure table, one row per (group, ancestor-or-self); level 0
-- is the group itself. Written by the projector with the group. The second index finds a
-- group's descendants (cancel a subtree, recursive job listing).
CREATE TABLE job_group_self_and_ancestors (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  ancestor_id INT NOT NULL,
  level INT NOT NULL,
  PRIMARY KEY (batch_id, job_group_id, ancestor_id),
  INDEX job_group_self_and_ancestors_descendants (batch_id, ancestor_id, job_group_id)
) ENGINE=InnoDB;

-- job_group_attributes: one row per group attribute; written by the projector with the group.
CREATE TABLE job_group_attributes (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  attr_key VARCHAR(100) NOT NULL,
  attr_value TEXT NULL,
  PRIMARY KEY (batch_id, job_group_id, attr_key),
  INDEX job_group_attributes_key_value (batch_id, attr_key, attr_value(255))
) ENGINE=InnoDB;

-- jobs: one row per job, inserted from batch.jobs_submitted (invisible until its update is
-- committed), state/attempt/exit code from job.* events. cores_mcpu and the other resource
-- columns are what the job asks of an instance; regions is a JSON list or NULL (any).
-- n_pending_parents: parents not yet complete. spec: the client's job spec (JSON text);
-- status: the worker's last status (JSON text).
CREATE TABLE jobs (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  update_id INT NOT NULL,
  job_group_id INT NOT NULL,
  state ENUM('Pending', 'Ready', 'Creating', 'Running', 'Success', 'Failed', 'Error',
             'Cancelled') NOT NULL DEFAULT 'Pending',
  committed BOOLEAN NOT NULL DEFAULT FALSE,
  always_run BOOLEAN NOT NULL DEFAULT FALSE,
  n_max_attempts INT NOT NULL DEFAULT 20,
  n_attempts INT NOT NULL DEFAULT 0,
  cores_mcpu INT NOT NULL,
  memory_bytes BIGINT NOT NULL DEFAULT 0,
  storage_gib INT NOT NULL DEFAULT 0,
  machine_type VARCHAR(100) NULL,
  preemptible BOOLEAN NOT NULL DEFAULT TRUE,
  regions TEXT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  n_pending_parents INT NOT NULL DEFAULT 0,
  cancelled BOOLEAN NOT NULL DEFAULT FALSE,
  cancel_reason VARCHAR(40) NULL,
  exit_code INT NULL,
  attempt_id VARCHAR(40) NULL,
  instance_name VARCHAR(100) NULL,
  start_time_ms BIGINT NULL,
  end_time_ms BIGINT NULL,
  spec MEDIUMTEXT NOT NULL,
  status MEDIUMTEXT NULL,
  PRIMARY KEY (batch_id, job_id),
  INDEX jobs_job_group (batch_id, job_group_id, job_id),
  INDEX jobs_state (batch_id, state, job_id),
  INDEX jobs_update (batch_id, update_id),
  INDEX jobs_instance (instance_name)
) ENGINE=InnoDB;

-- job_parents: DAG edges (job depends on parent); written by the projector from
-- batch.jobs_submitted. The second index lists a job's children.
CREATE TABLE job_parents (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  parent_id INT NOT NULL,
  PRIMARY KEY (batch_id, job_id, parent_id),
  INDEX job_parents_children (batch_id, parent_id, job_id)
) ENGINE=InnoDB;

-- job_attributes: one row per job attribute (the job's name is attribute 'name'); written by
-- the projector from batch.jobs_submitted.
CREATE TABLE job_attributes (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  attr_key VARCHAR(100) NOT NULL,
  attr_value TEXT NULL,
  PRIMARY KEY (batch_id, job_id, attr_key),
  INDEX job_attributes_key_value (batch_id, attr_key, attr_value(255))
) ENGINE=InnoDB;

-- attempts: one row per execution attempt, from job.scheduled; times from job.started,
-- attempt.heartbeat (rollup_time_ms: billed up to), job.completed / attempt.lost (reason).
CREATE TABLE attempts (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  attempt_id VARCHAR(40) NOT NULL,
  instance_name VARCHAR(100) NULL,
  start_time_ms BIGINT NULL,
  end_time_ms BIGINT NULL,
  rollup_time_ms BIGINT NULL,
  reason VARCHAR(40) NULL,
  PRIMARY KEY (batch_id, job_id, attempt_id),
  INDEX attempts_instance (instance_name),
  INDEX attempts_end_time (end_time_ms)
) ENGINE=InnoDB;

-- attempt_resources: what an attempt is billed for, quantity per ms of runtime in the
-- resource's unit; written by the projector from job.started / job.completed.
CREATE TABLE attempt_resources (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  attempt_id VARCHAR(40) NOT NULL,
  resource VARCHAR(100) NOT NULL,
  quantity BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_id, attempt_id, resource)
) ENGINE=InnoDB;
