-- A job whose deciding MJC carried no status document (only its main container ran, to an
-- exit, without error: schemas.execution.JobCompleted) keeps the facts the document follows
-- from: when the main container's process started and ended, and the worker's region. The
-- API renders the document from them and the row (services.worker.status.compact_status);
-- status stays NULL. A document of a few hundred bytes in every job row was a fifth of
-- MariaDB's CPU per no-op job end to end.
ALTER TABLE jobs ADD COLUMN main_start_ms BIGINT NULL, ADD COLUMN main_end_ms BIGINT NULL, ADD COLUMN worker_region VARCHAR(100) NULL;
