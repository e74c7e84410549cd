-- Per queue, the jobs of every state a queue's overview counts, waiting ones too (migration
-- 0014): asyncq_queue_overview (migration 0013) as it was, with the waiting jobs after the
-- running ones. A function of its own: the earlier one keeps its columns for the versions
-- that call it (a dashboard or a worker's depth sampler not yet upgraded).
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_queue_states()
    RETURNS TABLE (queue_name text, queue_ready bigint, queue_scheduled bigint,
                   queue_oldest float8, queue_running bigint, queue_waiting bigint,
                   queue_failed bigint, queue_done bigint, queue_paused boolean)
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
        ), waiting AS (
            -- Through asyncq_jobs_waiting_for, which holds every waiting job.
            SELECT j.queue, count(*) AS waiting
              FROM asyncq_jobs j WHERE j.status = 'waiting'
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
            UNION SELECT w.queue FROM waiting w UNION SELECT f.queue FROM failed f
            UNION SELECT d.queue FROM done d UNION SELECT s.name FROM asyncq_queues s
        )
        SELECT n.queue, coalesce(q.ready, 0), coalesce(q.scheduled, 0), q.oldest,
               coalesce(r.running, 0), coalesce(w.waiting, 0), coalesce(f.failed, 0),
               coalesce(d.done, 0), p.paused_at IS NOT NULL
          FROM names AS n
          LEFT JOIN queued AS q ON q.queue = n.queue
          LEFT JOIN running AS r ON r.queue = n.queue
          LEFT JOIN waiting AS w ON w.queue = n.queue
          LEFT JOIN failed AS f ON f.queue = n.queue
          LEFT JOIN done AS d ON d.queue = n.queue
          LEFT JOIN asyncq_queues AS p ON p.name = n.queue
         ORDER BY n.queue;
    END
    $function$
    $sql$, current_schema());
END
$migration$;
