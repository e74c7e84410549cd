-- Jobs of tasks a worker does not know (a rolling deploy that adds a task, two apps that
-- share a table): the worker gives such a job back without counting the attempt, and
-- claims no more jobs of that task (asyncq_claim's p_skip: the tasks it gave back), so
-- that a worker that knows it runs it. `unknown_since` is when a worker first gave it
-- back; the outcome of an attempt run by a worker that knows the task clears it. A job
-- still queued that long after (the worker's --unknown-task-grace, 10 minutes by
-- default: no worker ran it meanwhile) fails, naming the task.
--
-- Safe beside workers of the previous version: the column is nullable; asyncq_claim keeps
-- its columns and, with p_skip defaulting to NULL, its four arguments (the statements of
-- earlier workers find it again when they are planned next).
ALTER TABLE asyncq_jobs ADD COLUMN unknown_since timestamptz;

DROP FUNCTION asyncq_claim(text, int, interval, text[]);

DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_claim(p_worker text, p_limit int, p_lease interval, p_queues text[],
                                 p_skip text[] DEFAULT NULL)
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
                   AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
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
                   AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
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
                           AND (p_skip IS NULL OR j.task_name <> ALL(p_skip))
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


    -- Jobs whose task this worker does not know, given back: queued again after p_delay,
    -- the attempt not counted (cancelled, when a cancel came while it was held).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_give_back(p_worker text, p_ids bigint[], p_claims bigint[],
                                     p_errors text[], p_delay float8)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_statuses text[];
        v_awaited bigint[];
    BEGIN
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 ELSE 'queued' END::asyncq_job_status,
                   attempts = j.attempts - 1,
                   run_at = now() + make_interval(secs => p_delay),
                   expires_at = NULL,
                   finished_at = CASE WHEN j.abort_requested_at IS NOT NULL THEN now() END,
                   last_error = p_errors[width_bucket(j.id, p_ids)],
                   unknown_since = coalesce(j.unknown_since, now())
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status = 'cancelled')) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.status::text),
               array_agg(e.id) FILTER (WHERE e.awaited AND e.status <> 'queued')
          INTO v_ended, v_statuses, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT * FROM unnest(v_ended, v_statuses);
    END
    $function$
    $sql$, current_schema());

    -- Queued jobs that workers have given back for longer than p_grace, unknown to every
    -- worker that claimed them since: failed, naming the task.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_fail_unknown(p_grace interval, p_limit int)
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_failed bigint[];
        v_awaited bigint[];
    BEGIN
        WITH stale AS MATERIALIZED (
            SELECT u.id FROM asyncq_jobs u
             WHERE u.unknown_since < now() - p_grace AND u.status = 'queued'
             ORDER BY u.unknown_since
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED
        ), ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'failed', finished_at = now(),
                   last_error = format('TaskNotFound: no worker that knows the task %%s took'
                                       || ' this job within %%s of the first that did not',
                                       j.task_name, p_grace)
             WHERE j.id = ANY(ARRAY(SELECT s.id FROM stale s))
            RETURNING j.id, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.id) FILTER (WHERE e.awaited)
          INTO v_failed, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT unnest(v_failed);
    END
    $function$
    $sql$, current_schema());

    -- The outcomes of attempts run by a worker that knew the task clear unknown_since
    -- (migrations 0013 and 0015 otherwise).
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_mark_failed(p_worker text, p_ids bigint[], p_claims bigint[],
                                                  p_retry_in float8[], p_errors text[],
                                                  p_give_up bool[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_statuses text[];
        v_awaited bigint[];
    BEGIN
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
                   expires_at = NULL, unknown_since = NULL
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.status::text),
               array_agg(e.id) FILTER (WHERE e.awaited AND e.status <> 'queued')
          INTO v_ended, v_statuses, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT * FROM unnest(v_ended, v_statuses);
    END
    $function$
    $sql$, current_schema());

    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_mark_snoozed(p_worker text, p_ids bigint[],
                                                   p_claims bigint[], p_after float8[])
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_statuses text[];
        v_awaited bigint[];
    BEGIN
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 ELSE 'queued' END::asyncq_job_status,
                   attempts = j.attempts - 1,
                   run_at = now() + make_interval(secs => p_after[width_bucket(j.id, p_ids)]),
                   expires_at = NULL, unknown_since = NULL,
                   finished_at = CASE WHEN j.abort_requested_at IS NOT NULL THEN now() END
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.status, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.status::text),
               array_agg(e.id) FILTER (WHERE e.awaited AND e.status <> 'queued')
          INTO v_ended, v_statuses, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT * FROM unnest(v_ended, v_statuses);
    END
    $function$
    $sql$, current_schema());

    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_release(p_worker text, p_ids bigint[], p_claims bigint[],
                                              p_free int)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_statuses text[];
        v_awaited bigint[];
    BEGIN
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                                 WHEN j.handbacks >= p_free AND j.attempts >= j.max_attempts
                                 THEN 'failed' ELSE 'queued' END::asyncq_job_status,
                   attempts = CASE WHEN j.handbacks >= p_free THEN j.attempts
                                   ELSE j.attempts - 1 END,
                   handbacks = j.handbacks + 1,
                   run_at = now(), locked_at = NULL, expires_at = NULL, unknown_since = NULL,
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
            RETURNING j.id, j.status, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.status::text),
               array_agg(e.id) FILTER (WHERE e.awaited AND e.status <> 'queued')
          INTO v_ended, v_statuses, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT * FROM unnest(v_ended, v_statuses);
    END
    $function$
    $sql$, current_schema());
END
$migration$;
