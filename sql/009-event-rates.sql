-- event_rates (TOKENIZED): execution events per minute, for the ops dashboard's rates. minute is
-- the envelope's time_ms DIV 60000 (so a replay of the log gives the same rows); kind is 'SJ',
-- 'MJS', 'MJC' or 'cancelled' (job.cancelled). Written by the projector with one increment per
-- applied record of those kinds (duplicates on the log count: it is a rate of events), merged
-- per transaction. Reads sum n over tokens for a range of minutes (the primary key's prefix).
--
-- instances (005) is now written by the projector from instance.* events on the scheduler
-- topic. Its free_cores_mcpu is the capacity offered to new work as of the instance's last
-- event (cores_mcpu while active, 0 otherwise), not net of running attempts: the scheduler
-- keeps that live value in memory.
CREATE TABLE event_rates (
  minute BIGINT NOT NULL,
  kind VARCHAR(16) NOT NULL,
  token INT NOT NULL,
  n BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (minute, kind, token)
) ENGINE=InnoDB;
