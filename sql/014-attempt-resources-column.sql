-- What an attempt is billed for is a column of its attempts row (a JSON object, resource ->
-- quantity per ms, keys sorted: core.billing.resources_text), not four or five
-- attempt_resources rows: those were a third of MariaDB's share of a rebuild (400,000 of
-- 1,030,000 rows for 100,000 jobs; replay CPU per event -11 to -13% without them, measured).
-- Only the projector reads it, to bill heartbeats and completions. Rows already projected move
-- to the column, in the same text the projector writes.
ALTER TABLE attempts ADD COLUMN resources MEDIUMTEXT NULL;
SET SESSION group_concat_max_len = 1048576;
UPDATE attempts a JOIN (
  SELECT batch_id, job_id, attempt_id,
    CONCAT('{', GROUP_CONCAT(CONCAT('"', resource, '":', quantity) ORDER BY resource SEPARATOR ','), '}') AS doc
  FROM attempt_resources GROUP BY batch_id, job_id, attempt_id
) r ON r.batch_id = a.batch_id AND r.job_id = a.job_id AND r.attempt_id = a.attempt_id
  SET a.resources = r.doc;
DROP TABLE attempt_resources;
