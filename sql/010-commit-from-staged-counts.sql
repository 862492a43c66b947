-- batch_update_job_counts: what each update's bunches added, per job group and instance
-- collection, counted when the projector inserts the bunch's (new) jobs. The commit moves these
-- into the live counters in O(groups x instance collections) instead of reading and rewriting
-- every job row of the update: a job's row is written once, with its initial state, at
-- submission. n_ready counts jobs with no parent at all (the rest start Pending); the commit
-- resolves parents of earlier updates that already ended. Written by the projector.
CREATE TABLE batch_update_job_counts (
  batch_id BIGINT NOT NULL,
  update_id INT NOT NULL,
  job_group_id INT NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  n_jobs INT NOT NULL DEFAULT 0,
  n_ready INT NOT NULL DEFAULT 0,
  ready_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  n_ready_always_run INT NOT NULL DEFAULT 0,
  ready_always_run_cores_mcpu BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (batch_id, update_id, job_group_id, inst_coll)
) ENGINE=InnoDB;

-- A job is visible once its update is committed (batch_updates.committed): readers join the
-- update instead of a per-job flag the commit would have to rewrite on every row.
ALTER TABLE jobs DROP COLUMN committed;

-- Nothing reads jobs by update any more (the commit reads the staged counts, and the edges of
-- the update's jobs by primary key range); the index only cost every insert.
ALTER TABLE jobs DROP INDEX jobs_update;
