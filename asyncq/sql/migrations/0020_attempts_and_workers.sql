-- What operators look at: the workers that are live, every attempt of a job, its progress
-- and what its task logged.
--
-- Attempts. The plain path (a job done at its first attempt) writes nothing more than it
-- did: its attempt is the row's own columns, `locked_by` (the worker), `started_at` (set
-- by the claim: `locked_at` is renewed by every heartbeat), `finished_at`, and `run_at`
-- (when it was due: the wait is `started_at - run_at`). Every other end of an attempt (a
-- retry, a failure, a snooze, a hand-back, a give-back, a cancel, a rescue, a suspension)
-- appends a record of it to `history`, a JSON object {"dropped": n, "attempts": [...]}
-- that keeps the first 3 records and the last 10 (`dropped` counts those left out between
-- them). A record: attempt, worker, due_at, started_at, ended_at, outcome, error (with its
-- traceback), logs, progress (nulls left out). A done job that runs again (app.retry)
-- appends its done attempt first.
--
-- `progress` is what the running task last reported (ctx.progress), written fenced as
-- every write of a running job; `logs` what the done attempt's task logged (a failed
-- attempt's are in its record).
--
-- Workers. Each worker has a row in asyncq_workers while it runs: written as it starts,
-- refreshed every few seconds (`beat`), deleted as it stops. A row not refreshed for three
-- beats is a worker that died; the maintenance deletes such rows after an hour. A role
-- without rights on this table still runs workers (they are not listed).
--
-- Safe beside workers of the previous version: the new columns are nullable; the claims
-- keep their arguments and columns (and set started_at for them too); the writes that end
-- attempts keep theirs (the logs and progress they take now default to NULL), and the
-- statements of earlier workers find them again when they are planned next.
ALTER TABLE asyncq_jobs
    ADD COLUMN started_at timestamptz,  -- when the latest attempt was claimed
    ADD COLUMN history    jsonb,        -- the attempts that did not end done
    ADD COLUMN progress   jsonb,        -- what the task last reported (ctx.progress)
    ADD COLUMN logs       jsonb;        -- what the done attempt's task logged

CREATE TABLE asyncq_workers (
    id          text        PRIMARY KEY,
    host        text        NOT NULL,
    pid         int         NOT NULL,
    version     text        NOT NULL,
    app         text,                    -- MODULE:APP, when the worker was started by it
    queues      text[],                  -- NULL: every queue
    concurrency int         NOT NULL,
    running     int         NOT NULL DEFAULT 0,
    beat        interval    NOT NULL,    -- how often the row is refreshed
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

-- A record of an attempt, for `history`.
CREATE FUNCTION asyncq_attempt_record(p_attempt int, p_worker text, p_due timestamptz,
                                      p_started timestamptz, p_ended timestamptz,
                                      p_outcome text, p_error text, p_logs jsonb,
                                      p_progress jsonb)
RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'attempt', p_attempt, 'worker', p_worker, 'due_at', p_due, 'started_at', p_started,
        'ended_at', p_ended, 'outcome', p_outcome, 'error', p_error, 'logs', p_logs,
        'progress', p_progress))
$$;

-- `history` with one more record: the first 3 and the last 10 are kept.
CREATE FUNCTION asyncq_history_append(p_history jsonb, p_record jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN p_history IS NULL
            THEN jsonb_build_object('dropped', 0, 'attempts', jsonb_build_array(p_record))
        WHEN jsonb_array_length(p_history -> 'attempts') < 13
            THEN jsonb_set(p_history, '{attempts}',
                           (p_history -> 'attempts') || jsonb_build_array(p_record))
        ELSE jsonb_build_object('dropped', (p_history ->> 'dropped')::bigint + 1,
                                'attempts', ((p_history -> 'attempts') - 3)
                                            || jsonb_build_array(p_record))
    END
$$;

DROP FUNCTION asyncq_mark_failed(text, bigint[], bigint[], float8[], text[], bool[]);
DROP FUNCTION asyncq_mark_snoozed(text, bigint[], bigint[], float8[]);
DROP FUNCTION asyncq_mark_cancelled(text, bigint[], bigint[]);
DROP FUNCTION asyncq_release(text, bigint[], bigint[], int);
DROP FUNCTION asyncq_give_back(text, bigint[], bigint[], text[], float8);

DO $migration$
BEGIN
    -- The claims (migrations 0018 and 0013) as they were, but that they set started_at.
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_claim(p_worker text, p_limit int, p_lease interval, p_queues text[],
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
               expires_at = clock.now + p_lease, started_at = clock.now
          FROM clock
         WHERE j.id = ANY(ARRAY(SELECT c.id FROM chosen c))
        RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts, j.claims,
                  j.scheduled_at;
    END
    $function$
    $sql$, current_schema());


    -- The writes that end attempts (migrations 0015 and 0018), each now appending the
    -- attempt's record to `history`, with what its task logged (p_logs: JSON text per job,
    -- NULL for none) and the progress it reported last (p_progress, else the row's). The
    -- row keeps that progress when the job ends, and forgets it when the job is queued again.
    EXECUTE format($sql$
    -- The writes by id turn bitmap scans off, as migration 0015 says why.
    CREATE FUNCTION asyncq_mark_failed(p_worker text, p_ids bigint[], p_claims bigint[],
                                       p_retry_in float8[], p_errors text[], p_give_up bool[],
                                       p_logs text[] DEFAULT NULL,
                                       p_progress text[] DEFAULT NULL)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
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
                   expires_at = NULL, unknown_since = NULL,
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(),
                       CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                            WHEN p_give_up[width_bucket(j.id, p_ids)]
                              OR j.attempts >= j.max_attempts THEN 'failed'
                            ELSE 'retried' END,
                       p_errors[width_bucket(j.id, p_ids)],
                       (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                       coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress))),
                   progress = CASE WHEN p_give_up[width_bucket(j.id, p_ids)]
                                     OR j.attempts >= j.max_attempts
                                     OR j.abort_requested_at IS NOT NULL
                                   THEN coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb,
                                                 j.progress) END
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
    CREATE FUNCTION asyncq_mark_snoozed(p_worker text, p_ids bigint[], p_claims bigint[],
                                        p_after float8[], p_logs text[] DEFAULT NULL,
                                        p_progress text[] DEFAULT NULL)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
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
                   finished_at = CASE WHEN j.abort_requested_at IS NOT NULL THEN now() END,
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(),
                       CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                            ELSE 'snoozed' END,
                       NULL, (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                       coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress))),
                   progress = CASE WHEN j.abort_requested_at IS NOT NULL
                                   THEN coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb,
                                                 j.progress) END
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
    CREATE FUNCTION asyncq_mark_cancelled(p_worker text, p_ids bigint[], p_claims bigint[],
                                          p_logs text[] DEFAULT NULL,
                                          p_progress text[] DEFAULT NULL)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_awaited bigint[];
    BEGIN
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'cancelled', finished_at = now(), expires_at = NULL,
                   last_error = format('Cancelled: attempt %%s of %%s was aborted by a cancel',
                                       j.attempts, j.max_attempts),
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(), 'cancelled',
                       format('Cancelled: attempt %%s of %%s was aborted by a cancel',
                              j.attempts, j.max_attempts),
                       (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                       coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress))),
                   progress = coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress)
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended
        )
        SELECT array_agg(e.id), array_agg(e.id) FILTER (WHERE e.awaited)
          INTO v_ended, v_awaited
          FROM ended e CROSS JOIN announced;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT e, 'cancelled'::text FROM unnest(v_ended) AS e;
    END
    $function$
    $sql$, current_schema());

    EXECUTE format($sql$
    CREATE FUNCTION asyncq_release(p_worker text, p_ids bigint[], p_claims bigint[], p_free int,
                                   p_logs text[] DEFAULT NULL, p_progress text[] DEFAULT NULL)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
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
                                     ELSE j.last_error END,
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(),
                       CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                            ELSE 'handed_back' END,
                       CASE WHEN j.handbacks >= p_free
                            THEN format('HandedBack: attempt %%s of %%s was stopped by a'
                                        || ' worker''s shutdown before it ended; after %%s'
                                        || ' hand-backs that did not count, each one counts',
                                        j.attempts, j.max_attempts, p_free) END,
                       (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                       coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress))),
                   progress = CASE WHEN (j.handbacks >= p_free AND j.attempts >= j.max_attempts)
                                     OR j.abort_requested_at IS NOT NULL
                                   THEN coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb,
                                                 j.progress) END
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
    CREATE FUNCTION asyncq_give_back(p_worker text, p_ids bigint[], p_claims bigint[],
                                     p_errors text[], p_delay float8, p_logs text[] DEFAULT NULL,
                                     p_progress text[] DEFAULT NULL)
    RETURNS TABLE (job_id bigint, job_status text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
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
                   unknown_since = coalesce(j.unknown_since, now()),
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(),
                       CASE WHEN j.abort_requested_at IS NOT NULL THEN 'cancelled'
                            ELSE 'given_back' END,
                       p_errors[width_bucket(j.id, p_ids)],
                       (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                       coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress))),
                   progress = CASE WHEN j.abort_requested_at IS NOT NULL
                                   THEN coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb,
                                                 j.progress) END
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

    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_reap_expired(p_limit int)
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
                   expires_at = NULL,
                   history = asyncq_history_append(j.history, asyncq_attempt_record(
                       j.attempts, j.locked_by, j.run_at, j.started_at, now(), 'lease_expired',
                       format('LeaseExpired: worker %%s stopped renewing its lease'
                              || ' during attempt %%s of %%s',
                              j.locked_by, j.attempts, j.max_attempts),
                       NULL, j.progress)),
                   progress = CASE WHEN j.attempts >= j.max_attempts
                                     OR j.abort_requested_at IS NOT NULL THEN j.progress END
             WHERE j.id = ANY(ARRAY(SELECT e.id FROM expired e))
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

    -- Done jobs with what their tasks logged or reported: mark_done_results (migration
    -- 0015) with each job's logs and last progress (JSON text, or NULL). Only the outcomes
    -- that carry them come here: the plain path keeps its own statements.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_mark_done_with(p_worker text, p_ids bigint[], p_claims bigint[],
                                          p_results text[], p_logs text[], p_progress text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_awaited bigint[];
    BEGIN
        WITH ended AS (
            UPDATE asyncq_jobs AS j
               SET status = 'done', finished_at = now(), expires_at = NULL,
                   result = (p_results[width_bucket(j.id, p_ids)])::jsonb,
                   logs = (p_logs[width_bucket(j.id, p_ids)])::jsonb,
                   progress = coalesce((p_progress[width_bucket(j.id, p_ids)])::jsonb, j.progress)
             WHERE j.id = ANY(p_ids)
               AND j.claims = p_claims[width_bucket(j.id, p_ids)]
               AND j.status = 'running' AND j.locked_by = p_worker
            RETURNING j.id, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM ended
            HAVING EXISTS (SELECT FROM asyncq_result_listeners
                            WHERE seen_at > now() - interval '1 minute')
        )
        SELECT array_agg(e.id), array_agg(e.id) FILTER (WHERE e.awaited)
          INTO v_ended, v_awaited
          FROM ended e LEFT JOIN announced ON true;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY SELECT unnest(v_ended);
    END
    $function$
    $sql$, current_schema());

    -- The progress running tasks reported (ctx.progress), several jobs' in one statement,
    -- each written only while its job is running by the claim and worker that write it.
    -- Returns the jobs written.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_write_progress(p_worker text, p_ids bigint[], p_claims bigint[],
                                          p_progress text[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_bitmapscan = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        UPDATE asyncq_jobs AS j
           SET progress = (p_progress[width_bucket(j.id, p_ids)])::jsonb
         WHERE j.id = ANY(p_ids)
           AND j.claims = p_claims[width_bucket(j.id, p_ids)]
           AND j.status = 'running' AND j.locked_by = p_worker
        RETURNING j.id;
    END
    $function$
    $sql$, current_schema());

    -- A job suspending itself records its run (migration 0015), with what it waits for.
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_suspend(p_worker text, p_id bigint, p_claim bigint, p_kind text,
                                   p_until timestamptz, p_seconds float8, p_key text,
                                   p_awaited bigint[], p_step text, p_seq int, p_attempt int)
    RETURNS TABLE (suspend_state text, suspend_payload text, suspend_until timestamptz)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_until timestamptz := coalesce(p_until, now() + make_interval(secs => p_seconds));
        v_payload text;
        v_live bigint[];
    BEGIN
        IF p_kind = 'event' THEN
            PERFORM pg_advisory_xact_lock(hashtext('asyncq.event.' || current_schema() || '.'
                                                   || p_key));
        END IF;
        PERFORM 1 FROM asyncq_jobs j
         WHERE j.id = p_id AND j.claims = p_claim AND j.status = 'running'
           AND j.locked_by = p_worker
           FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'lost'::text, NULL::text, NULL::timestamptz;
            RETURN;
        END IF;
        IF p_step IS NOT NULL THEN
            INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)
            VALUES (p_id, p_step, p_seq, jsonb_build_object('until', v_until), p_attempt,
                    p_claim, now())
            ON CONFLICT (job_id, name, seq) DO NOTHING;
        END IF;
        IF p_kind = 'sleep' THEN
            IF v_until <= now() THEN
                RETURN QUERY SELECT 'due'::text, NULL::text, v_until;
                RETURN;
            END IF;
        ELSIF p_kind = 'event' THEN
            SELECT e.payload::text INTO v_payload FROM asyncq_events e WHERE e.key = p_key;
            IF FOUND THEN
                RETURN QUERY SELECT 'emitted'::text, coalesce(v_payload, 'null'), v_until;
                RETURN;
            END IF;
            IF v_until <= now() THEN
                RETURN QUERY SELECT 'timeout'::text, NULL::text, v_until;
                RETURN;
            END IF;
        ELSE
            SELECT array_agg(w.id) INTO v_live
              FROM (SELECT a.id FROM asyncq_jobs a
                     WHERE a.id = ANY(p_awaited)
                       AND a.status IN ('queued', 'running', 'waiting')
                     ORDER BY a.id
                       FOR SHARE) AS w;
            IF v_live IS NULL THEN
                RETURN QUERY SELECT 'ended'::text, NULL::text, NULL::timestamptz;
                RETURN;
            END IF;
            UPDATE asyncq_jobs a SET awaited = true
             WHERE a.id = ANY(v_live) AND NOT a.awaited;
            INSERT INTO asyncq_waits (on_id, job_id)
            SELECT l, p_id FROM unnest(v_live) AS l
            ON CONFLICT DO NOTHING;
            v_until := NULL;
        END IF;
        UPDATE asyncq_jobs j
           SET status = 'waiting',
               waiting_for = CASE p_kind WHEN 'event' THEN 'event:' || p_key ELSE p_kind END,
               run_at = coalesce(v_until, 'infinity'), attempts = j.attempts - 1,
               expires_at = NULL,
               history = asyncq_history_append(j.history, asyncq_attempt_record(
                   j.attempts, j.locked_by, j.run_at, j.started_at, now(), 'waiting', NULL,
                   NULL, NULL) || jsonb_build_object(
                       'waiting_for', CASE p_kind WHEN 'event' THEN 'event:' || p_key
                                                  ELSE p_kind END))
         WHERE j.id = p_id;
        IF v_until IS NOT NULL THEN
            -- Workers wake the waiting jobs that come due at that time.
            PERFORM pg_notify(asyncq_channel(),
                              chr(29) || ceil(extract(epoch FROM v_until - now()) * 1000)::bigint);
        END IF;
        RETURN QUERY SELECT 'waiting'::text, NULL::text, v_until;
    END
    $function$
    $sql$, current_schema());

    -- A done job that runs again records its done attempt first (migration 0015).
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_retry(p_id bigint, p_from_step text)
    RETURNS TABLE (retry_was text, retry_steps_dropped bigint)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_was text;
        v_from bigint;
        v_dropped bigint := 0;
    BEGIN
        SELECT j.status::text INTO v_was FROM asyncq_jobs j WHERE j.id = p_id FOR NO KEY UPDATE;
        IF NOT FOUND OR v_was NOT IN ('done', 'failed', 'cancelled') THEN
            RETURN QUERY SELECT v_was, 0::bigint;
            RETURN;
        END IF;
        IF p_from_step IS NOT NULL THEN
            SELECT min(s.position) INTO v_from FROM asyncq_steps s
             WHERE s.job_id = p_id AND s.name = p_from_step;
            IF v_from IS NULL THEN
                RETURN QUERY SELECT 'no step'::text, 0::bigint;
                RETURN;
            END IF;
            DELETE FROM asyncq_steps s WHERE s.job_id = p_id AND s.position >= v_from;
            GET DIAGNOSTICS v_dropped = ROW_COUNT;
        END IF;
        UPDATE asyncq_jobs j
           SET status = 'queued', attempts = 0, handbacks = 0, run_at = now(),
               finished_at = NULL, locked_by = NULL, locked_at = NULL, expires_at = NULL,
               abort_requested_at = NULL, result = NULL, waiting_for = NULL,
               history = CASE WHEN v_was = 'done'
                              THEN asyncq_history_append(j.history, asyncq_attempt_record(
                                  j.attempts, j.locked_by, j.run_at, j.started_at,
                                  j.finished_at, 'done', NULL, j.logs, j.progress))
                              ELSE j.history END,
               started_at = NULL, logs = NULL, progress = NULL
         WHERE j.id = p_id;
        RETURN QUERY SELECT v_was, v_dropped;
    END
    $function$
    $sql$, current_schema());
END
$migration$;
