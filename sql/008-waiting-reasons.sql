-- Why ready jobs are not scheduled: the scheduler's scheduler.waiting_reasons events (control
-- topic), projected so a job's status can say why it waits (codes in core/waiting.py).

-- user_waiting_reasons: the latest reason a (user, inst_coll) queue got fewer placements than
-- it has ready jobs; written by the projector; a cleared entry deletes the row.
CREATE TABLE user_waiting_reasons (
  user VARCHAR(100) NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  reason VARCHAR(40) NOT NULL,
  message TEXT NOT NULL,
  since_ms BIGINT NOT NULL,
  epoch BIGINT NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (user, inst_coll)
) ENGINE=InnoDB;

-- job_waiting_reasons: the reason of one ready job when it is its own (its regions, its size:
-- the first blocked jobs of a queue only); written by the projector; cleared entries delete.
CREATE TABLE job_waiting_reasons (
  batch_id BIGINT NOT NULL,
  job_id INT NOT NULL,
  user VARCHAR(100) NOT NULL,
  inst_coll VARCHAR(100) NOT NULL,
  reason VARCHAR(40) NOT NULL,
  message TEXT NOT NULL,
  since_ms BIGINT NOT NULL,
  epoch BIGINT NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (batch_id, job_id)
) ENGINE=InnoDB;

-- waiting_reasons_epoch: one row (scope 'scheduler'), the newest scheduler epoch whose waiting
-- reasons were applied; events of older epochs are ignored, a newer epoch replaces every row
-- above. Written by the projector.
CREATE TABLE waiting_reasons_epoch (
  scope VARCHAR(20) NOT NULL,
  epoch BIGINT NOT NULL,
  time_updated_ms BIGINT NOT NULL,
  PRIMARY KEY (scope)
) ENGINE=InnoDB;
