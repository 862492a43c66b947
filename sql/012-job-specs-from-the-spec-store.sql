-- A job's spec is read from the spec store (ingest writes every bunch's specs there before the
-- bunch is on the log; workers read them there too), not from a third copy in each jobs row:
-- the column was a third of MariaDB's cost of inserting a job row (measured, 224-byte specs),
-- and every later update of the row carried it.
ALTER TABLE jobs DROP COLUMN spec;
