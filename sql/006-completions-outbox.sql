-- The completions outbox: one row per completion of a batch (job_group_id 0) or a job group.

-- completions_outbox: written by the projector in the same transaction as the completion (the
-- job.completed, job.cancelled, attempt.lost or update.committed that left no unfinished job),
-- with the counts as of then. A batch reopened by an update completes again with more jobs, so
-- (batch_id, job_group_id, n_jobs) names one completion. Everything but published_ms is a
-- projection of the log (a rebuild reproduces it); published_ms is set by the completions
-- service once the row is on the completions topic (NULL: not yet published).
CREATE TABLE completions_outbox (
  batch_id BIGINT NOT NULL,
  job_group_id INT NOT NULL,
  n_jobs INT NOT NULL,
  outcome ENUM('success', 'failure', 'cancelled') NOT NULL,
  n_succeeded INT NOT NULL,
  n_failed INT NOT NULL,
  n_cancelled INT NOT NULL,
  time_completed_ms BIGINT NOT NULL,
  published_ms BIGINT NULL,
  PRIMARY KEY (batch_id, job_group_id, n_jobs),
  INDEX completions_outbox_unpublished (published_ms, time_completed_ms)
) ENGINE=InnoDB;
