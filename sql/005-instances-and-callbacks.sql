-- Instances and instance collections (projections of scheduler events and configuration),
-- callback deliveries (the completions dispatcher's own outbox) and scheduler elections.

-- inst_colls: instance collections: pools (is_pool, one worker_type/preemptibility/region) and
-- job-private collections. Written by the projector from configuration (control) events.
CREATE TABLE inst_colls (
  name VARCHAR(100) NOT NULL,
  is_pool BOOLEAN NOT NULL,
  cloud VARCHAR(20) NOT NULL,
  worker_type VARCHAR(40) NULL,
  worker_cores INT NULL,
  preemptible BOOLEAN NOT NULL DEFAULT TRUE,
  region VARCHAR(100) NULL,
  boot_disk_size_gb INT NOT NULL,
  worker_local_ssd_data_disk BOOLEAN NOT NULL DEFAULT FALSE,
  worker_external_ssd_data_disk_size_gb INT NOT NULL DEFAULT 0,
  max_instances INT NOT NULL,
  max_live_instances INT NOT NULL,
  max_new_instances_per_loop INT NOT NULL DEFAULT 10,
  standing_worker_cores INT NOT NULL DEFAULT 0,
  worker_max_idle_time_secs INT NOT NULL DEFAULT 30,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB;

-- instances: one row per VM (or local worker process), keyed by its name; written by the
-- projector from instance.* events. free_cores_mcpu is as of the last event the projector saw
-- (the scheduler keeps the live value in memory). for_batch_id/for_job_id: job-private owner.
CREATE TABLE instances (
  name VARCHAR(100) NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  machine_type VARCHAR(100) NOT NULL,
  region VARCHAR(100) NOT NULL,
  preemptible BOOLEAN NOT NULL DEFAULT TRUE,
  cores_mcpu INT NOT NULL,
  free_cores_mcpu INT NOT NULL,
  state ENUM('pending', 'active', 'inactive', 'deleted') NOT NULL DEFAULT 'pending',
  address VARCHAR(255) NULL,
  for_batch_id BIGINT NULL,
  for_job_id INT NULL,
  reason VARCHAR(100) NULL,
  time_created_ms BIGINT NOT NULL,
  time_activated_ms BIGINT NULL,
  time_deactivated_ms BIGINT NULL,
  time_deleted_ms BIGINT NULL,
  last_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (name),
  INDEX instances_inst_coll_state (inst_coll, state),
  INDEX instances_state (state)
) ENGINE=InnoDB;

-- callback_deliveries: HTTP callbacks owed for completed batches (job_group_id 0) and job
-- groups, one row per idempotency key; written by the callback dispatcher as it consumes the
-- completions topic and retries (status pending -> delivered | failed).
CREATE TABLE callback_deliveries (
  idempotency_key VARCHAR(200) NOT NULL,
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  url TEXT NOT NULL,
  payload MEDIUMTEXT NULL,
  status ENUM('pending', 'delivered', 'failed') NOT NULL DEFAULT 'pending',
  attempts INT NOT NULL DEFAULT 0,
  next_attempt_ms BIGINT NULL,
  last_error TEXT NULL,
  time_created_ms BIGINT NOT NULL,
  time_delivered_ms BIGINT NULL,
  PRIMARY KEY (idempotency_key),
  INDEX callback_deliveries_due (status, next_attempt_ms),
  INDEX callback_deliveries_job_group (batch_id, job_group_id)
) ENGINE=InnoDB;

-- scheduler_epochs: one row per scheduler election (fencing epoch); written by the projector
-- from scheduler.elected. The highest epoch is the active scheduler.
CREATE TABLE scheduler_epochs (
  epoch BIGINT NOT NULL,
  scheduler_id VARCHAR(100) NOT NULL,
  time_elected_ms BIGINT NOT NULL,
  PRIMARY KEY (epoch)
) ENGINE=InnoDB;

-- feature_flags: operator switches such as 'frozen' (ingest answers 503); written by the
-- projector from control events.
CREATE TABLE feature_flags (
  name VARCHAR(100) NOT NULL,
  enabled BOOLEAN NOT NULL DEFAULT FALSE,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB;
