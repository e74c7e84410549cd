-- asyncq: no transaction
-- The edges of a waiter by the jobs it waits for, in their order: what the end of a job
-- that is waited for reads to find the waiter's last edge (migration 0022). It serves
-- every read by waiter the index it replaces served. Built CONCURRENTLY: workers go on
-- writing.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_waits_waiter ON asyncq_waits (job_id, on_id);
DROP INDEX CONCURRENTLY IF EXISTS asyncq_waits_job;
