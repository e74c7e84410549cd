-- The limited claim takes jobs of limited tasks for the worker's free runners only, and
-- jobs of other tasks for the jobs it holds ahead as well (docs/explanation/workers.md,
-- "How a worker runs"): a job claimed ahead waits for a runner, and a limited task's
-- job counts against its limit from its claim, so one held ahead would keep its room
-- from another worker while it waited. Until now an App with limited tasks claimed
-- nothing ahead, and each claim waited on the worker's slots to run dry: the claim and
-- the jobs took turns instead of overlapping.
--
-- asyncq_claim_limited has a new argument, p_limited: the most jobs of limited tasks the
-- claim takes (each limited task's room is cut to it, and so is their sum, counted in the
-- claim's order). The rest of the function is as migration 0010 made it. The function of
-- ten arguments, which workers of schema versions 7 to 10 call, stays: it calls the new
-- one with p_limited = p_limit, as before.
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
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('asyncq.limits.' || current_schema()));
        v_paused := ARRAY(SELECT name FROM asyncq_queues WHERE paused_at IS NOT NULL);

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

        IF coalesce(cardinality(v_ids), 0) >= p_limit OR v_seen < 2::bigint * p_limit THEN
            NULL;  -- the head held them all
        ELSIF p_queues IS NOT NULL OR cardinality(v_paused) > 0 THEN
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
            ),
            first AS (
                SELECT j.id, j.priority, j.run_at
                  FROM task t
                 CROSS JOIN LATERAL (
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
                 WHERE t.task_name <> ALL(p_names::text[])
                 ORDER BY j.priority DESC, j.run_at, j.id
                 LIMIT p_limit
            )
            SELECT array_agg(f.id), array_agg(f.priority), array_agg(f.run_at)
              INTO v_ids, v_priorities, v_run_ats
              FROM first f;
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
             WHERE j.id IN (SELECT id FROM picked) AND j.status = 'queued'
               AND j.run_at <= now()
               AND (p_queues::text[] IS NULL OR j.queue = ANY(p_queues::text[]))
               AND array_position(v_paused, j.queue) IS NULL
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
          FROM chosen, clock
         WHERE j.id = chosen.id
        RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts, j.claims,
                  j.scheduled_at;
    END
    $function$
    $sql$, current_schema());
END
$migration$;

DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_claim_limited(
        p_worker text, p_limit int, p_lease interval, p_queues text[], p_scan int,
        p_names text[], p_concurrency int[], p_rate int[], p_period float8[],
        p_group_concurrency int[]
    ) RETURNS TABLE (
        job_id bigint, job_task_name text, job_queue text, job_args text, job_attempts int,
        job_max_attempts int, job_claims bigint, job_scheduled_at timestamptz
    )
    LANGUAGE sql VOLATILE
    SET search_path = %I
    AS $function$
        SELECT * FROM asyncq_claim_limited(p_worker, p_limit, p_lease, p_queues, p_scan,
                                           p_names, p_concurrency, p_rate, p_period,
                                           p_group_concurrency, p_limit)
    $function$
    $sql$, current_schema());
END
$migration$;
