-- Nothing looks jobs or attempts up by instance: the scheduler keeps what runs where in memory,
-- and the operators' busy-instances view finds open attempts by end_time_ms. Both indexes only
-- cost writes: jobs_instance moved on every schedule and completion (instance_name is set, then
-- cleared), attempts_instance on every attempt.
ALTER TABLE jobs DROP INDEX jobs_instance;

ALTER TABLE attempts DROP INDEX attempts_instance;
