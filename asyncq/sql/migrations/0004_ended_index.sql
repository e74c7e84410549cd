-- asyncq: no transaction
-- Failed and cancelled jobs by when they ended, for the listings of the asyncq command
-- and the dashboard: without it, finding ten failed jobs would read every done row.
-- Few rows enter it (done ones never do), and only when a job ends that way.
-- Built CONCURRENTLY: workers, of this version or the previous one, go on writing.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_ended ON asyncq_jobs (finished_at)
    WHERE status IN ('failed', 'cancelled');
