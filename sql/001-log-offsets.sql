-- Log bookkeeping: what each consumer has applied, and id allocation. Neither is derived from
-- events by folding; both are written in the same transaction as the work they track.

-- applied_offsets: the next offset to apply per (consumer, topic, partition). Written by every
-- projector/consumer in the same transaction as the projection rows it changed (exactly-once).
CREATE TABLE applied_offsets (
  consumer VARCHAR(100) NOT NULL,
  topic VARCHAR(200) NOT NULL,
  kafka_partition INT NOT NULL,
  next_offset BIGINT NOT NULL,
  updated_at_ms BIGINT NOT NULL,
  PRIMARY KEY (consumer, topic, kafka_partition)
) ENGINE=InnoDB;

-- id_sequences: named counters (e.g. 'batch_id'); written by ingest id allocation, not a
-- projection (a rebuild keeps it). Rows are created by their allocator with
-- INSERT ... ON DUPLICATE KEY UPDATE next_value = LAST_INSERT_ID(next_value + n).
CREATE TABLE id_sequences (
  name VARCHAR(100) NOT NULL,
  next_value BIGINT NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB;
