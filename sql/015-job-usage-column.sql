-- A job's own usage is a column of its jobs row (a JSON array of [resource, usage] pairs,
-- sorted by resource, no zeros: core.billing.usage_text), not a row per job and resource in
-- aggregated_job_resources: those were 400,000 of a rebuild's 628,000 rows for 100,000 jobs
-- (2.1 s of its 5.0 s copy floor, measured), and four upserts per job in the live projector,
-- which sets the column in the same UPDATE that ends the job. Only the batch's one writer
-- changes it (it was never tokenized); the API reads it with JSON_TABLE. Usage already
-- projected moves to the column, in the same text the projector writes.
ALTER TABLE jobs ADD COLUMN resource_usage MEDIUMTEXT NULL;
SET SESSION group_concat_max_len = 1048576;
UPDATE jobs j JOIN (
  SELECT batch_id, job_id,
    CONCAT('[', GROUP_CONCAT(CONCAT('["', resource, '",', resource_usage, ']') ORDER BY CAST(resource AS BINARY) SEPARATOR ','), ']') AS doc
  FROM aggregated_job_resources WHERE resource_usage <> 0 GROUP BY batch_id, job_id
) u ON u.batch_id = j.batch_id AND u.job_id = j.job_id
  SET j.resource_usage = u.doc;
DROP TABLE aggregated_job_resources;
