-- The plain claim (claim_any and claim_queues in queries.sql) as a function, so that it
-- runs on a generic plan. Sent as a statement, the server planned it afresh for each
-- claim: its LIMIT is a parameter, and a generic plan, costed for a LIMIT it cannot see
-- (a tenth of the ready rows), always looked dearer than a custom one for 100 rows, so
-- psycopg's prepared statement never left custom plans. The generic plan is the same
-- plan (the ordered scan of asyncq_jobs_ready that stops at the LIMIT, then a look-up in
-- the primary key by = ANY), and planning it once instead of per claim made a claim of
-- 100 jobs about a sixth cheaper on the server. The setting holds inside the function
-- only; the rest of the worker's statements keep the server's choice.
--
-- With p_queues NULL, any queue; else only those. Each branch is a statement of its own,
-- with a plan of its own. Both are the statements that workers of schema version 8 send,
-- for the same reasons:
--
-- Every claim returns the job's trace_context (NULL unless a traced defer wrote it):
-- here a NULL column of the row being written, which costs the statement and the
-- driver next to nothing, so one statement serves workers with tracing on or off.
-- A paused queue (asyncq_queues.paused_at set) is skipped: its list is read once per claim.
-- The NOT EXISTS is not redundant: with it the planner keeps the ordered scan of the
-- ready index that stops at the LIMIT; faced with "<> ALL" of an array it cannot see,
-- it would sort every ready row first.
-- The lease runs from when the rows are written (clock_timestamp(), read once), not from
-- when the statement began (now()): a claim that waited behind a table lock (a CREATE
-- INDEX, say) still gets a whole lease.
-- The rows are updated by "id = ANY(ARRAY(...))" of the chosen ids, not by a join to
-- them: a join's plan follows the planner's guess of how many rows the LIMIT lets
-- through, and for a prepared statement (LIMIT unknown: a tenth of the ready rows) it
-- was a hash join over every row of the table; = ANY is a look-up in the primary key
-- whatever the guess (the server's instructions per claimed job: 266.9k -> 253.2k in
-- batches of 10).
-- The rows come back in the order they were chosen in (the UPDATE returns them in the
-- order of the primary key): a worker that claims more than it can run at once (claiming
-- ahead) starts them in that order.
--
-- The tables are named by the search path fixed here, as in asyncq_claim_limited, so that
-- they are found whatever the search path of the statement that calls it.
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_claim(p_worker text, p_limit int, p_lease interval, p_queues text[])
    RETURNS TABLE (
        job_id bigint, job_task_name text, job_queue text, job_args text, job_attempts int,
        job_max_attempts int, job_claims bigint, job_scheduled_at timestamptz,
        job_trace_context text
    )
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    AS $function$
    BEGIN
        IF p_queues IS NULL THEN
            RETURN QUERY
            WITH next AS MATERIALIZED (
                SELECT j.id FROM asyncq_jobs j
                 WHERE j.status = 'queued' AND j.run_at <= now()
                   AND (NOT EXISTS (SELECT FROM asyncq_queues WHERE paused_at IS NOT NULL)
                        OR j.queue <> ALL(ARRAY(SELECT name FROM asyncq_queues
                                                 WHERE paused_at IS NOT NULL)))
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
            UPDATE asyncq_jobs AS j
               SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
                   locked_by = p_worker, locked_at = clock.now, lease = p_lease,
                   expires_at = clock.now + p_lease
              FROM clock
             WHERE j.id = ANY(ARRAY(SELECT n.id FROM next n))
            RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts,
                      j.claims, j.scheduled_at, j.trace_context::text, j.priority, j.run_at
            )
            SELECT c.id, c.task_name, c.queue, c.args, c.attempts, c.max_attempts, c.claims,
                   c.scheduled_at, c.trace_context
              FROM claimed c
             ORDER BY c.priority DESC, c.run_at, c.id;
        ELSE
            RETURN QUERY
            WITH next AS MATERIALIZED (
                SELECT j.id FROM asyncq_jobs j
                 WHERE j.status = 'queued' AND j.run_at <= now() AND j.queue = ANY(p_queues)
                   AND (NOT EXISTS (SELECT FROM asyncq_queues WHERE paused_at IS NOT NULL)
                        OR j.queue <> ALL(ARRAY(SELECT name FROM asyncq_queues
                                                 WHERE paused_at IS NOT NULL)))
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
            UPDATE asyncq_jobs AS j
               SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
                   locked_by = p_worker, locked_at = clock.now, lease = p_lease,
                   expires_at = clock.now + p_lease
              FROM clock
             WHERE j.id = ANY(ARRAY(SELECT n.id FROM next n))
            RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts,
                      j.claims, j.scheduled_at, j.trace_context::text, j.priority, j.run_at
            )
            SELECT c.id, c.task_name, c.queue, c.args, c.attempts, c.max_attempts, c.claims,
                   c.scheduled_at, c.trace_context
              FROM claimed c
             ORDER BY c.priority DESC, c.run_at, c.id;
        END IF;
    END
    $function$
    $sql$, current_schema());
END
$migration$;
