-- The statements a worker repeats, as functions whose plans are the index plans whatever
-- the statistics said when a session first ran them.
--
-- A session keeps the plan of a statement it runs again and again: psycopg prepares it,
-- and after five executions the server settles on a generic plan, which it keeps for the
-- connection's life; a function's statements are planned once per session. A plan made
-- while asyncq_jobs was empty (a new install, or the quiet hour after autovacuum found
-- the table empty) is a sequential scan, with a sort of every ready row for the claim:
-- cheapest for an empty table, and kept through the burst that follows, when each claim
-- and each outcome reads the whole table (a burst of 20,000 jobs drained 3.9x slower).
-- Here each of those statements runs in a function that plans with sequential scans and
-- sorts turned off (jit too: on servers before 18 a turned-off path is costed at 1e10,
-- past the threshold at which jit would compile every call), so that its only plans are
-- the index plans, on empty, tiny or skewed statistics alike. A sort that no index can
-- spare (the claimed rows, put back in the claim's order) is still made.
--
-- Each write after the claim finds its rows by "id = ANY(ids)", a look-up in the primary
-- key, and reads each row's values at its id's place in the arrays (width_bucket over
-- the ids, sorted by the worker; where an id comes twice, the last place: its latest
-- claim), as mark_done did already; no write joins to unnest() any more.
--
-- The claim of some queues: of one queue, the ordered scan of asyncq_jobs_ready_by_queue;
-- of several, that scan for each queue, each stopping at the claim's size, and the first
-- of them all in the claim's order (rows another claim holds are skipped, as before). The
-- scan of asyncq_jobs_ready filtered by queue, which a plan could pick before (and would
-- still, on statistics that saw one queue only), reads every ready job of the other
-- queues ahead of the first of these queues'. The queue is asked for as a range of one
-- ("BETWEEN q AND q"), and the order begins with it: for a queue given by "=", the
-- planner drops it from the order, which asyncq_jobs_ready then gives as well; so, with
-- sorts turned off, only the index by queue gives the order asked for.
--
-- Safe beside workers of the previous version: they send their statements, which are
-- unchanged; asyncq_claim keeps its arguments and its columns.
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_claim(p_worker text, p_limit int, p_lease interval, p_queues text[])
    RETURNS TABLE (
        job_id bigint, job_task_name text, job_queue text, job_args text, job_attempts int,
        job_max_attempts int, job_claims bigint, job_scheduled_at timestamptz,
        job_trace_context text
    )
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
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
        ELSIF cardinality(p_queues) = 1 THEN
            RETURN QUERY
            WITH next AS MATERIALIZED (
                SELECT j.id FROM asyncq_jobs j
                 WHERE j.status = 'queued' AND j.queue BETWEEN p_queues[1] AND p_queues[1]
                   AND j.run_at <= now()
                   AND NOT EXISTS (SELECT FROM asyncq_queues
                                    WHERE name = p_queues[1] AND paused_at IS NOT NULL)
                 ORDER BY j.queue, j.priority DESC, j.run_at, j.id
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
                SELECT head.id
                  FROM (SELECT DISTINCT name FROM unnest(p_queues) AS name) AS q
                 CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at FROM asyncq_jobs j
                         WHERE j.status = 'queued' AND j.queue BETWEEN q.name AND q.name
                           AND j.run_at <= now()
                         ORDER BY j.queue, j.priority DESC, j.run_at, j.id
                         LIMIT p_limit
                           FOR NO KEY UPDATE SKIP LOCKED) AS head
                 WHERE NOT EXISTS (SELECT FROM asyncq_queues
                                    WHERE name = q.name AND paused_at IS NOT NULL)
                 ORDER BY head.priority DESC, head.run_at, head.id
                 LIMIT p_limit
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

    -- Jobs whose tasks returned nothing to store. The announcement runs only while an App
    -- waits for results (the HAVING): a call of asyncq_notify_ids costs more than the
    -- update of ten rows.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_done(p_worker text, p_ids bigint[], p_claims bigint[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'done', finished_at = now(), expires_at = NULL
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended
            HAVING EXISTS (SELECT FROM asyncq_result_listeners
                            WHERE seen_at > now() - interval '1 minute')
        )
        SELECT e.id FROM ended e LEFT JOIN announced ON true;
    END
    $function$
    $sql$, current_schema());

    -- Done jobs with their results: JSON text, or NULL (nothing to store).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_done_results(p_worker text, p_ids bigint[], p_claims bigint[],
                                             p_results text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'done', finished_at = now(), expires_at = NULL,
                   result = (p_results[width_bucket(j.id, p_ids)])::jsonb
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended
            HAVING EXISTS (SELECT FROM asyncq_result_listeners
                            WHERE seen_at > now() - interval '1 minute')
        )
        SELECT e.id FROM ended e LEFT JOIN announced ON true;
    END
    $function$
    $sql$, current_schema());

    -- A failed attempt: back to queued after its backoff, or failed once attempts are used
    -- up (or at once with give_up), or cancelled when a cancel came while it ran.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_failed(p_worker text, p_ids bigint[], p_claims bigint[],
                                       p_retry_in float8[], p_errors text[], p_give_up bool[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 WHEN p_give_up[width_bucket(j.id, p_ids)]
                                   OR j.attempts >= j.max_attempts THEN 'failed'
                                 ELSE 'queued' END::asyncq_job_status,
                   run_at = CASE WHEN p_give_up[width_bucket(j.id, p_ids)]
                                   OR j.attempts >= j.max_attempts
                                   OR j.abort_requested_at IS NOT NULL
                                 THEN j.run_at
                                 ELSE now() + make_interval(
                                     secs => p_retry_in[width_bucket(j.id, p_ids)]) END,
                   finished_at = CASE WHEN p_give_up[width_bucket(j.id, p_ids)]
                                        OR j.attempts >= j.max_attempts
                                        OR j.abort_requested_at IS NOT NULL THEN now() END,
                   last_error = p_errors[width_bucket(j.id, p_ids)],
                   expires_at = NULL
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT e.id, e.status::text FROM ended e CROSS JOIN announced;
    END
    $function$
    $sql$, current_schema());

    -- The task asked to run again later: back to queued, the attempt not counted
    -- (cancelled, when a cancel came while it ran).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_snoozed(p_worker text, p_ids bigint[], p_claims bigint[],
                                        p_after float8[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 ELSE 'queued' END::asyncq_job_status,
                   attempts = j.attempts - 1,
                   run_at = now() + make_interval(secs => p_after[width_bucket(j.id, p_ids)]),
                   expires_at = NULL,
                   finished_at = CASE WHEN j.abort_requested_at IS NOT NULL THEN now() END
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT e.id, e.status::text FROM ended e CROSS JOIN announced;
    END
    $function$
    $sql$, current_schema());

    -- Attempts stopped by a cancel: the job ends cancelled, and is not retried.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_cancelled(p_worker text, p_ids bigint[], p_claims bigint[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'cancelled', finished_at = now(), expires_at = NULL,
                   last_error = format('Cancelled: attempt %%s of %%s was aborted by a cancel',
                                       j.attempts, j.max_attempts)
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT e.id, e.status::text FROM ended e CROSS JOIN announced;
    END
    $function$
    $sql$, current_schema());

    -- Unfinished jobs handed back at shutdown. The first hand-backs of a job do not count
    -- its attempt; after p_free of them each one does (a job longer than the grace period,
    -- stopped by every deploy, must not loop for ever), and the last fails the job. A job
    -- a cancel asked to stop is cancelled instead.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_release(p_worker text, p_ids bigint[], p_claims bigint[], p_free int)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 WHEN j.handbacks >= p_free AND j.attempts >= j.max_attempts
                                 THEN 'failed' ELSE 'queued' END::asyncq_job_status,
                   attempts = CASE WHEN j.handbacks >= p_free THEN j.attempts
                                   ELSE j.attempts - 1 END,
                   handbacks = j.handbacks + 1,
                   run_at = now(), locked_at = NULL, expires_at = NULL,
                   finished_at = CASE WHEN (j.handbacks >= p_free AND j.attempts >= j.max_attempts)
                                        OR j.abort_requested_at IS NOT NULL THEN now() END,
                   last_error = CASE WHEN j.handbacks >= p_free
                                     THEN format('HandedBack: attempt %%s of %%s was stopped by a'
                                                 || ' worker''s shutdown before it ended; after %%s'
                                                 || ' hand-backs that did not count, each one counts',
                                                 j.attempts, j.max_attempts, p_free)
                                     ELSE j.last_error END
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT e.id, e.status::text FROM ended e CROSS JOIN announced;
    END
    $function$
    $sql$, current_schema());

    -- Leases renewed from when the rows are written (clock_timestamp(), read once);
    -- returns the jobs still held, each with whether a cancel asked to stop it.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_heartbeat(p_worker text, p_ids bigint[], p_claims bigint[])
    RETURNS TABLE (job_id bigint, job_abort_requested boolean)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now)
        UPDATE asyncq_jobs AS j
           SET locked_at = clock.now, expires_at = clock.now + j.lease
          FROM clock
         WHERE j.id = ANY(p_ids)
           AND j.claims = p_claims[width_bucket(j.id, p_ids)]
           AND j.status = 'running' AND j.locked_by = p_worker
        RETURNING j.id, j.abort_requested_at IS NOT NULL;
    END
    $function$
    $sql$, current_schema());

    -- The running attempts of a worker that a cancel asked to stop (read by workers
    -- without a LISTEN connection).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_aborts_requested(p_worker text, p_ids bigint[], p_claims bigint[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT j.id FROM asyncq_jobs AS j
         WHERE j.id = ANY(p_ids)
           AND j.claims = p_claims[width_bucket(j.id, p_ids)]
           AND j.status = 'running' AND j.locked_by = p_worker
           AND j.abort_requested_at IS NOT NULL;
    END
    $function$
    $sql$, current_schema());

    -- Of the outcomes the fence refused, those written already by these very claims (a
    -- write that committed, whose answer was lost with its connection): each kind of
    -- outcome is told apart from the rescuer's write (LeaseExpired, the attempt counted).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_written_by_claims(p_worker text, p_ids bigint[], p_claims bigint[],
                                             p_kinds text[], p_errors text[], p_attempts int[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT j.id, j.status::text
          FROM asyncq_jobs AS j
         WHERE j.id = ANY(p_ids)
           AND j.claims = p_claims[width_bucket(j.id, p_ids)]
           AND j.locked_by = p_worker AND j.status <> 'running'
           AND CASE p_kinds[width_bucket(j.id, p_ids)]
                 WHEN 'done' THEN j.status = 'done'
                 WHEN 'failed' THEN j.status <> 'done'
                                    AND j.last_error = p_errors[width_bucket(j.id, p_ids)]
                 WHEN 'snoozed' THEN j.status IN ('queued', 'cancelled')
                                     AND j.attempts = p_attempts[width_bucket(j.id, p_ids)] - 1
                 WHEN 'cancelled' THEN j.status = 'cancelled'
                                       AND j.last_error LIKE 'Cancelled: %% was aborted by a cancel'
                 WHEN 'released' THEN j.status <> 'done'
                                      AND (j.attempts = p_attempts[width_bucket(j.id, p_ids)] - 1
                                           OR j.last_error LIKE 'HandedBack: %%')
                 ELSE false
               END;
    END
    $function$
    $sql$, current_schema());

    -- Jobs whose worker stopped renewing the lease: the attempt counts. A job a cancel
    -- asked to stop is cancelled.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_reap_expired(p_limit int)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH expired AS MATERIALIZED (
            SELECT x.id FROM asyncq_jobs x
             WHERE x.status = 'running' AND x.expires_at < now()
             ORDER BY x.expires_at
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED
        ), ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 WHEN j.attempts >= j.max_attempts THEN 'failed'
                                 ELSE 'queued' END::asyncq_job_status,
                   run_at = now(),
                   finished_at = CASE WHEN j.attempts >= j.max_attempts
                                        OR j.abort_requested_at IS NOT NULL THEN now() END,
                   last_error = format('LeaseExpired: worker %%s stopped renewing its lease'
                                       || ' during attempt %%s of %%s',
                                       j.locked_by, j.attempts, j.max_attempts),
                   expires_at = NULL
             WHERE j.id = ANY(ARRAY(SELECT e.id FROM expired e))
            RETURNING j.id, j.status
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT e.id, e.status::text FROM ended e CROSS JOIN announced;
    END
    $function$
    $sql$, current_schema());

    -- Done jobs past their retention, oldest first; returns how many were deleted.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_prune_done(p_retention interval, p_limit int)
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH pruned AS (
            DELETE FROM asyncq_jobs
             WHERE id = ANY(ARRAY(SELECT d.id FROM asyncq_jobs d
                                   WHERE d.status = 'done' AND d.finished_at < now() - p_retention
                                   ORDER BY d.finished_at
                                   LIMIT p_limit))
            RETURNING 1
        )
        SELECT count(*) FROM pruned;
    END
    $function$
    $sql$, current_schema());

    -- What an App's waiters for results look up: how each of these jobs ended (done,
    -- failed, cancelled); jobs still queued or running come back with their status alone.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_job_endings(p_ids bigint[])
    RETURNS TABLE (job_id bigint, job_status text, job_result text, job_last_error text)
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT j.id, j.status::text,
               CASE WHEN j.status = 'done' THEN j.result::text END,
               CASE WHEN j.status <> 'done' THEN j.last_error END
          FROM asyncq_jobs AS j
         WHERE j.id = ANY(p_ids);
    END
    $function$
    $sql$, current_schema());

    -- Per queue: ready and scheduled jobs, the age of the oldest ready one, running,
    -- failed, done in the last hour, and whether it is paused (the metrics' depth sampler
    -- reads it every few seconds, the dashboard on every page). Each count reads its
    -- state's index.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_queue_overview()
    RETURNS TABLE (queue_name text, queue_ready bigint, queue_scheduled bigint,
                   queue_oldest float8, queue_running bigint, queue_failed bigint,
                   queue_done bigint, queue_paused boolean)
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        WITH queued AS (
            SELECT j.queue, count(*) FILTER (WHERE j.run_at <= now()) AS ready,
                   count(*) FILTER (WHERE j.run_at > now()) AS scheduled,
                   extract(epoch FROM now() - min(j.run_at) FILTER (WHERE j.run_at <= now()))::float8
                       AS oldest
              FROM asyncq_jobs j WHERE j.status = 'queued' GROUP BY j.queue
        ), running AS (
            SELECT j.queue, count(*) AS running
              FROM asyncq_jobs j WHERE j.expires_at IS NOT NULL AND j.status = 'running'
             GROUP BY j.queue
        ), failed AS (
            SELECT j.queue, count(*) AS failed
              FROM asyncq_jobs j WHERE j.status IN ('failed', 'cancelled') AND j.status = 'failed'
             GROUP BY j.queue
        ), done AS (
            SELECT j.queue, count(*) AS done
              FROM asyncq_jobs j
             WHERE j.status = 'done' AND j.finished_at > now() - interval '1 hour'
             GROUP BY j.queue
        ), names AS (
            SELECT q.queue FROM queued q UNION SELECT r.queue FROM running r
            UNION SELECT f.queue FROM failed f UNION SELECT d.queue FROM done d
            UNION SELECT s.name FROM asyncq_queues s
        )
        SELECT n.queue, coalesce(q.ready, 0), coalesce(q.scheduled, 0), q.oldest,
               coalesce(r.running, 0), coalesce(f.failed, 0), coalesce(d.done, 0),
               p.paused_at IS NOT NULL
          FROM names AS n
          LEFT JOIN queued AS q ON q.queue = n.queue
          LEFT JOIN running AS r ON r.queue = n.queue
          LEFT JOIN failed AS f ON f.queue = n.queue
          LEFT JOIN done AS d ON d.queue = n.queue
          LEFT JOIN asyncq_queues AS p ON p.name = n.queue
         ORDER BY n.queue;
    END
    $function$
    $sql$, current_schema());

    -- The live job holding a unique key, for a defer whose insert met it.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_live_job_with_key(p_unique_key text)
    RETURNS SETOF bigint
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT j.id FROM asyncq_jobs AS j
         WHERE j.unique_key = p_unique_key AND j.status IN ('queued', 'running');
    END
    $function$
    $sql$, current_schema());
END
$migration$;

-- The claim of limited tasks (migration 0012) as it was, but that it finds the jobs it
-- picked, to lock them and then to claim them, by "id = ANY(ARRAY(...))", not by a join:
-- with sequential scans turned off, the join of a plan made on the empty table was a
-- scan of the whole primary key for each (in a burst of 100,000 jobs, 3,600 pages read
-- by a claim of 10 where a fresh session read 160). The lock takes them in the order of
-- their ids: only the primary key gives that order without a sort (sorts are off), so
-- the plan looks them up there, and does not scan a ready index that the other
-- conditions also fit, as it did on the empty table's statistics (2,100 pages).
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_claim_limited(
        p_worker text, p_limit int, p_lease interval, p_queues text[], p_scan int,
        p_names text[], p_concurrency int[], p_rate int[], p_period float8[],
        p_group_concurrency int[], p_limited int
    ) RETURNS TABLE (
        job_id bigint, job_task_name text, job_queue text, job_args text, job_attempts int,
        job_max_attempts int, job_claims bigint, job_scheduled_at timestamptz
    )
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_paused text[];
        v_seen bigint;
        v_ids bigint[];
        v_priorities int[];
        v_run_ats timestamptz[];
        v_loose boolean;
        v_mark text[];
        v_skipped int;
        v_held boolean;
        v_firsts jsonb;
        v_looked boolean := false;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('asyncq.limits.' || current_schema()));
        v_paused := ARRAY(SELECT name FROM asyncq_queues WHERE paused_at IS NOT NULL);

        v_loose := p_queues IS NULL AND cardinality(v_paused) = 0;
        v_mark := regexp_match(current_setting('asyncq.claim_head_held', true),
                               '^([0-9]+) ([^ ]+)(?: (\[.*))?$');
        IF v_loose AND v_mark[2] = current_schema() THEN
            v_skipped := v_mark[1]::int;
            v_firsts := v_mark[3]::jsonb;
        END IF;

        IF v_skipped < 15 THEN
            v_held := true;  -- at the last look
        ELSE
            SELECT count(*),
                   (array_agg(h.id ORDER BY h.priority DESC, h.run_at, h.id)
                        FILTER (WHERE h.task_name <> ALL(p_names::text[])))[1:p_limit],
                   (array_agg(h.priority ORDER BY h.priority DESC, h.run_at, h.id)
                        FILTER (WHERE h.task_name <> ALL(p_names::text[])))[1:p_limit],
                   (array_agg(h.run_at ORDER BY h.priority DESC, h.run_at, h.id)
                        FILTER (WHERE h.task_name <> ALL(p_names::text[])))[1:p_limit]
              INTO v_seen, v_ids, v_priorities, v_run_ats
              FROM (SELECT id, task_name, priority, run_at
                      FROM asyncq_jobs
                     WHERE status = 'queued' AND run_at <= now()
                       AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                       AND array_position(v_paused, queue) IS NULL
                     ORDER BY priority DESC, run_at, id
                     LIMIT 2::bigint * p_limit) AS h;

            v_held := coalesce(cardinality(v_ids), 0) < p_limit AND v_seen >= 2::bigint * p_limit;
            IF v_skipped IS NOT NULL AND NOT v_held THEN
                PERFORM set_config('asyncq.claim_head_held', '', false);
            END IF;
            v_skipped := -1;
            v_firsts := NULL;  -- looked for again
        END IF;

        IF NOT v_held THEN
            NULL;  -- the head's unlimited jobs fill the batch, or there are no more
        ELSIF NOT v_loose THEN
            SELECT array_agg(u.id), array_agg(u.priority), array_agg(u.run_at)
              INTO v_ids, v_priorities, v_run_ats
              FROM (SELECT id, priority, run_at
                      FROM asyncq_jobs
                     WHERE status = 'queued' AND run_at <= now()
                       AND task_name <> ALL(p_names::text[])
                       AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                       AND array_position(v_paused, queue) IS NULL
                     ORDER BY priority DESC, run_at, id
                     LIMIT p_limit) AS u;
        ELSE
            LOOP
                IF v_firsts IS NULL THEN
                    v_looked := true;
                    WITH RECURSIVE task AS (
                        SELECT f.task_name, f.priority, f.run_at, f.id
                          FROM (SELECT task_name, priority, run_at, id
                                  FROM asyncq_jobs
                                 WHERE status = 'queued'
                                 ORDER BY task_name, priority DESC, run_at, id
                                 LIMIT 1) AS f
                        UNION ALL
                        SELECT n.task_name, n.priority, n.run_at, n.id
                          FROM task t
                         CROSS JOIN LATERAL (
                                SELECT task_name, priority, run_at, id
                                  FROM asyncq_jobs
                                 WHERE status = 'queued' AND task_name > t.task_name
                                 ORDER BY task_name, priority DESC, run_at, id
                                 LIMIT 1) AS n
                    )
                    SELECT coalesce(jsonb_agg(jsonb_build_array(t.task_name, t.priority, t.run_at, t.id)),
                                    '[]')
                      INTO v_firsts
                      FROM task t
                     WHERE t.task_name <> ALL(p_names::text[]);
                END IF;

                WITH task AS (
                    SELECT e->>0 AS task_name, (e->>1)::int AS priority,
                           (e->>2)::timestamptz AS run_at, (e->>3)::bigint AS id
                      FROM jsonb_array_elements(v_firsts) AS e
                     WHERE e->>0 <> ALL(p_names::text[])  -- remembered by an App that limits less
                ),
                found AS MATERIALIZED (
                    SELECT t.task_name, j.id, j.priority, j.run_at
                      FROM task t
                     CROSS JOIN LATERAL (
                            (SELECT id, priority, run_at
                               FROM asyncq_jobs
                              WHERE status = 'queued' AND run_at <= now()
                                AND task_name = t.task_name AND priority > t.priority
                              ORDER BY task_name, priority DESC, run_at, id
                              LIMIT p_limit)
                            UNION ALL
                            (SELECT id, priority, run_at
                               FROM asyncq_jobs
                              WHERE status = 'queued' AND run_at <= now()
                                AND task_name = t.task_name AND priority = t.priority
                                AND (run_at, id) >= (t.run_at, t.id)
                              ORDER BY task_name, priority DESC, run_at, id
                              LIMIT p_limit)
                            UNION ALL
                            (SELECT id, priority, run_at
                               FROM asyncq_jobs
                              WHERE status = 'queued' AND run_at <= now()
                                AND task_name = t.task_name AND priority < t.priority
                              ORDER BY task_name, priority DESC, run_at, id
                              LIMIT p_limit)) AS j
                ),
                first AS (
                    SELECT id, priority, run_at
                      FROM found
                     ORDER BY priority DESC, run_at, id
                     LIMIT p_limit
                )
                SELECT (SELECT array_agg(f.id) FROM first f),
                       (SELECT array_agg(f.priority) FROM first f),
                       (SELECT array_agg(f.run_at) FROM first f),
                       (SELECT coalesce(jsonb_agg(jsonb_build_array(t.task_name,
                                                                    coalesce(n.priority, t.priority),
                                                                    coalesce(n.run_at, t.run_at),
                                                                    coalesce(n.id, t.id))), '[]')
                          FROM task t
                          LEFT JOIN LATERAL (
                                 SELECT d.priority, d.run_at, d.id
                                   FROM found d
                                  WHERE d.task_name = t.task_name
                                  ORDER BY d.priority DESC, d.run_at, d.id
                                  LIMIT 1) AS n ON true)
                  INTO v_ids, v_priorities, v_run_ats, v_firsts;

                -- Fewer than asked from the places remembered: a task whose jobs are all
                -- newer than the last look may be waiting. Look for the tasks again, now.
                EXIT WHEN v_looked OR coalesce(cardinality(v_ids), 0) >= p_limit;
                v_firsts := NULL;
            END LOOP;

            PERFORM set_config('asyncq.claim_head_held',
                               (v_skipped + 1) || ' ' || current_schema() || ' ' || v_firsts::text,
                               false);
        END IF;

        RETURN QUERY
        WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
        limits AS MATERIALIZED (
            SELECT *
              FROM unnest(p_names::text[], p_concurrency::int[], p_rate::int[],
                          p_period::float8[], p_group_concurrency::int[])
                   AS l(task_name, concurrency, rate, period, group_concurrency)
        ),
        running AS MATERIALIZED (
            SELECT task_name, group_key, count(*) AS n
              FROM asyncq_jobs
             WHERE expires_at IS NOT NULL AND task_name = ANY(p_names::text[])
             GROUP BY task_name, group_key
        ),
        room AS MATERIALIZED (
            SELECT l.task_name, l.group_concurrency,
                   least(p_limited,
                         l.concurrency - (SELECT coalesce(sum(r.n), 0) FROM running r
                                           WHERE r.task_name = l.task_name),
                         l.rate - (SELECT coalesce(sum(s.count), 0) FROM asyncq_rate_starts s, clock
                                    WHERE s.task_name = l.task_name
                                      AND s.started_at > clock.now - make_interval(secs => l.period * 1.05)))
                   AS room
              FROM limits l
        ),
        unlimited AS MATERIALIZED (
            SELECT * FROM unnest(v_ids, v_priorities, v_run_ats) AS u(id, priority, run_at)
        ),
        limited AS MATERIALIZED (
            SELECT j.id, j.priority, j.run_at
              FROM room
             CROSS JOIN LATERAL (
                    SELECT id, priority, run_at
                      FROM asyncq_jobs
                     WHERE status = 'queued' AND run_at <= now()
                       AND task_name BETWEEN room.task_name AND room.task_name
                       AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                       AND array_position(v_paused, queue) IS NULL
                     ORDER BY task_name, priority DESC, run_at, id
                     LIMIT room.room) AS j
             WHERE room.room > 0 AND room.group_concurrency IS NULL
        ),
        -- Grouped tasks: the first ready jobs of the task outside saturated groups (at most
        -- p_scan, and at most room * group_concurrency: what the room could take from groups
        -- that each have all their room), then per group the first ones by id, as many as the
        -- group has room for, taken round-robin over the groups up to the task's room. A group
        -- with more ready jobs than that at the head of the queue fills its room and is skipped
        -- by the next claims.
        candidates AS MATERIALIZED (
            SELECT j.id, j.priority, j.run_at, j.group_key, room.task_name, room.room,
                   room.group_concurrency
              FROM room
             CROSS JOIN LATERAL (
                    SELECT id, priority, run_at, group_key
                      FROM asyncq_jobs
                     WHERE status = 'queued' AND run_at <= now()
                       AND task_name BETWEEN room.task_name AND room.task_name
                       AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                       AND array_position(v_paused, queue) IS NULL
                       AND (group_key IS NULL
                            OR group_key <> ALL(ARRAY(SELECT r.group_key FROM running r
                                                       WHERE r.task_name = room.task_name
                                                         AND r.group_key IS NOT NULL
                                                         AND r.n >= room.group_concurrency)))
                     ORDER BY task_name, priority DESC, run_at, id
                     LIMIT least(p_scan, room.room * room.group_concurrency)) AS j
             WHERE room.room > 0 AND room.group_concurrency IS NOT NULL
        ),
        in_group_order AS (
            SELECT c.*,
                   row_number() OVER (PARTITION BY c.task_name, c.group_key ORDER BY c.id) AS place,
                   (SELECT coalesce(sum(r.n), 0) FROM running r
                     WHERE r.task_name = c.task_name AND r.group_key = c.group_key) AS busy
              FROM candidates c
        ),
        in_task_order AS (
            SELECT g.*,
                   row_number() OVER (PARTITION BY g.task_name
                                      ORDER BY g.place, g.priority DESC, g.run_at, g.id) AS turn
              FROM in_group_order g
             WHERE g.group_key IS NULL OR g.place <= g.group_concurrency - g.busy
        ),
        picked AS MATERIALIZED (
            SELECT id
              FROM (SELECT id, priority, run_at, is_limited,
                           count(*) FILTER (WHERE is_limited)
                               OVER (ORDER BY priority DESC, run_at, id) AS limited_so_far
                      FROM (SELECT id, priority, run_at, false AS is_limited FROM unlimited
                            UNION ALL SELECT id, priority, run_at, true FROM limited
                            UNION ALL SELECT id, priority, run_at, true
                                        FROM in_task_order WHERE turn <= room)
                           AS candidate) AS counted
             WHERE NOT is_limited OR limited_so_far <= p_limited
             ORDER BY priority DESC, run_at, id
             LIMIT p_limit
        ),
        chosen AS MATERIALIZED (
            SELECT j.id, j.task_name
              FROM asyncq_jobs j
             WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked p)) AND j.status = 'queued'
               AND j.run_at <= now()
               AND (p_queues::text[] IS NULL OR j.queue = ANY(p_queues::text[]))
               AND array_position(v_paused, j.queue) IS NULL
             ORDER BY j.id
               FOR NO KEY UPDATE SKIP LOCKED
        ),
        started AS (
            INSERT INTO asyncq_rate_starts (task_name, started_at, count)
            SELECT c.task_name,
                   to_timestamp(floor(extract(epoch FROM clock.now) / (l.period / 20))
                                * (l.period / 20)),
                   count(*)
              FROM chosen c JOIN limits l ON l.task_name = c.task_name, clock
             WHERE l.rate IS NOT NULL
             GROUP BY 1, 2
                ON CONFLICT (task_name, started_at)
                DO UPDATE SET count = asyncq_rate_starts.count + excluded.count
        ),
        forgotten AS (
            DELETE FROM asyncq_rate_starts s
             USING limits l, clock
             WHERE s.task_name = l.task_name AND l.rate IS NOT NULL
               AND s.started_at <= clock.now - make_interval(secs => l.period * 1.05)
        )
        UPDATE asyncq_jobs AS j
           SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
               locked_by = p_worker, locked_at = clock.now, lease = p_lease,
               expires_at = clock.now + p_lease
          FROM clock
         WHERE j.id = ANY(ARRAY(SELECT c.id FROM chosen c))
        RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts, j.claims,
                  j.scheduled_at;
    END
    $function$
    $sql$, current_schema());
END
$migration$;
