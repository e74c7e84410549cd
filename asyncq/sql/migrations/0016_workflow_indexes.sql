-- asyncq: no transaction
-- The indexes of work that spans jobs, built CONCURRENTLY: workers go on writing.
-- Waiting jobs by when they come due (a sleep's end, a wait's timeout): what the waker
-- reads. Only waiting jobs with such a time enter it (not those that wait for other jobs
-- or for an event without a timeout, whose run_at is 'infinity').
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_waiting ON asyncq_jobs (run_at)
    WHERE status = 'waiting' AND run_at < 'infinity';
-- Waiting jobs by what they wait for: the jobs an emitted event wakes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_waiting_for ON asyncq_jobs (waiting_for)
    WHERE status = 'waiting';
-- A job's children: a cancel's cascade, `asyncq job`'s listing. Only spawned jobs enter it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_children ON asyncq_jobs (parent_id)
    WHERE parent_id IS NOT NULL;
