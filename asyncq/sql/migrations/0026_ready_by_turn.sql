-- asyncq: no transaction
-- The queued jobs that have a turn (deferred in a group, migration 0025), in the order the
-- claim takes a fair task's: no other job is in it, so no other insert pays for it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_ready_by_turn
    ON asyncq_jobs (task_name, priority DESC, turn, id) WHERE status = 'queued' AND turn IS NOT NULL
