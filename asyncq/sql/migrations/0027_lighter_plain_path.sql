-- The plain path of a job, its claim and its done write, closer to what it cost the server
-- before the workflows (issue 44), their plans still pinned to the indexes (migration 0013).
--
-- Each setting a function pins is set at every call and restored as it returns: the first
-- one costs most (about 8,000 instructions a call), search_path about 5,000 more than any
-- other, which costs 2,000-3,000. Neither function sets search_path now: every name in
-- them is qualified with the schema. The claim keeps the four others (its last sort, of
-- the jobs it claimed, is one enable_sort turns off at a cost of 1e10: jit must stay off).
-- The done write keeps plan_cache_mode (one generic plan for the session's life),
-- enable_seqscan and enable_bitmapscan (that plan is a look-up of the ids in the primary
-- key, whatever the statistics say when it is made: a bitmap scan would lock the rows in
-- the order of their places in the table, not of their ids); it has no sort, and it reads
-- the live result listeners through an index of their seen_at (renewed every few seconds
-- by each), not a scan of the table turned off at a cost of 1e10: jit, off by its cost
-- threshold, stays off without a setting.
--
-- The done write is one statement: the ids it ended are returned by the statement that
-- ends them, and the waiters of those that are waited for are released in it (the
-- function that does it reads them after the update, which a data-modifying WITH runs to
-- its end first).
--
-- Both keep their arguments and columns: a worker of the previous version calls them as
-- it did.
CREATE INDEX asyncq_result_listeners_seen ON asyncq_result_listeners (seen_at);

DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_claim(p_worker text, p_limit int, p_lease interval, p_queues text[],
                                 p_skip text[] DEFAULT NULL)
    RETURNS TABLE (
        job_id bigint, job_task_name text, job_queue text, job_args text, job_attempts int,
        job_max_attempts int, job_claims bigint, job_scheduled_at timestamptz,
        job_trace_context text
    )
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        IF p_queues IS NULL THEN
            RETURN QUERY
            WITH next AS MATERIALIZED (
                SELECT j.id FROM %1$I.asyncq_jobs j
                 WHERE j.status = 'queued' AND j.run_at <= now()
                   AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
                   AND (NOT EXISTS (SELECT FROM %1$I.asyncq_queues WHERE paused_at IS NOT NULL)
                        OR j.queue <> ALL(ARRAY(SELECT name FROM %1$I.asyncq_queues
                                                 WHERE paused_at IS NOT NULL)))
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
            UPDATE %1$I.asyncq_jobs AS j
               SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
                   locked_by = p_worker, locked_at = clock.now, lease = p_lease,
                   expires_at = clock.now + p_lease, started_at = clock.now
              FROM clock
             WHERE j.id = ANY(ARRAY(SELECT n.id FROM next n))
            RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts,
                      j.claims, j.scheduled_at, j.trace_context::text, j.priority, j.run_at
            )
            SELECT c.id, c.task_name, c.queue, c.args, c.attempts, c.max_attempts, c.claims,
                   c.scheduled_at, c.trace_context
              FROM claimed c
             ORDER BY c.priority DESC, c.run_at, c.id;
        ELSIF cardinality(p_queues) = 1 THEN
            RETURN QUERY
            WITH next AS MATERIALIZED (
                SELECT j.id FROM %1$I.asyncq_jobs j
                 WHERE j.status = 'queued' AND j.queue BETWEEN p_queues[1] AND p_queues[1]
                   AND j.run_at <= now()
                   AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
                   AND NOT EXISTS (SELECT FROM %1$I.asyncq_queues
                                    WHERE name = p_queues[1] AND paused_at IS NOT NULL)
                 ORDER BY j.queue, j.priority DESC, j.run_at, j.id
                 LIMIT p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
            UPDATE %1$I.asyncq_jobs AS j
               SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
                   locked_by = p_worker, locked_at = clock.now, lease = p_lease,
                   expires_at = clock.now + p_lease, started_at = clock.now
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
                SELECT head.id
                  FROM (SELECT DISTINCT name FROM unnest(p_queues) AS name) AS q
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at FROM %1$I.asyncq_jobs j
                         WHERE j.status = 'queued' AND j.queue BETWEEN q.name AND q.name
                           AND j.run_at <= now()
                           AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
                         ORDER BY j.queue, j.priority DESC, j.run_at, j.id
                         LIMIT p_limit
                           FOR NO KEY UPDATE SKIP LOCKED) AS head
                 WHERE NOT EXISTS (SELECT FROM %1$I.asyncq_queues
                                    WHERE name = q.name AND paused_at IS NOT NULL)
                 ORDER BY head.priority DESC, head.run_at, head.id
                 LIMIT p_limit
            ), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
            UPDATE %1$I.asyncq_jobs AS j
               SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
                   locked_by = p_worker, locked_at = clock.now, lease = p_lease,
                   expires_at = clock.now + p_lease, started_at = clock.now
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
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_mark_done(p_worker text, p_ids bigint[], p_claims bigint[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE %1$I.asyncq_jobs AS j
               SET status = 'done', finished_at = now(), expires_at = NULL
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.awaited
        ), announced AS (
            SELECT %1$I.asyncq_notify_ids(%1$I.asyncq_results_channel(), array_agg(id)) FROM ended
            HAVING EXISTS (SELECT FROM %1$I.asyncq_result_listeners
                            WHERE seen_at > now() - interval '1 minute')
        ), released AS MATERIALIZED (
            SELECT %1$I.asyncq_release_waiters(array_agg(e.id)) FROM ended e
             WHERE e.awaited
            HAVING count(*) > 0
        )
        SELECT e.id
          FROM ended e LEFT JOIN announced ON true LEFT JOIN released ON true;
    END
    $function$
    $sql$, current_schema());

END
$migration$;
