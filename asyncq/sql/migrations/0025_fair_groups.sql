-- Jobs deferred in groups (task.options(group=...)) are claimed round-robin over their
-- groups, across every worker: a group with a backlog of 100,000 jobs delays another
-- group's first job by one claim at most.
--
-- Turns, given as jobs are deferred: each task whose jobs are deferred in groups has a
-- row in asyncq_fair_tasks with the turn its claims have reached (served), and each of
-- its groups a row in asyncq_group_turns with the last turn given to one of its jobs. A
-- job deferred in a group takes the turn after the later of the two (and the jobs of one
-- defer_many the turns after that, one each): a group with a backlog holds turns far
-- ahead, and a group with nothing queued starts at the turn being served. The claim
-- takes a fair task's grouped jobs in turn order (asyncq_jobs_ready_by_turn, a partial
-- index of queued jobs with a turn: no other job pays for it) and moves served forward.
-- Deferring reads served without a lock (a turn a little behind only puts the job a
-- little ahead); the jobs of one group are deferred one defer at a time (the group's
-- row is locked until the defer commits).
--
-- A worker claims a fair task's jobs with the limited claim (the plain claim has no
-- notion of turns, and stays as it was for every other App): the task is named among the
-- limited ones, with no limit of its own unless it has some, from the moment a worker
-- reads it in asyncq_fair_tasks (as it starts, and when the first grouped defer of a
-- task tells it, on the channel, as set_limits does).
--
-- Jobs of such a task without a turn (deferred without a group, or before this
-- migration) are taken when they are among the first `room` of the task's ready jobs (by
-- priority and age: as the groups' oldest jobs are claimed, they come to it), ahead of
-- the grouped ones of their priority. Looking further would fetch each job looked at
-- from the table (the turn is not in asyncq_jobs_ready_by_task), on every claim.
CREATE TABLE asyncq_fair_tasks (
    task_name text PRIMARY KEY,
    served    bigint NOT NULL DEFAULT 0
);
CREATE TABLE asyncq_group_turns (
    task_name text NOT NULL,
    group_key text NOT NULL,
    turn      bigint NOT NULL,
    PRIMARY KEY (task_name, group_key)
);
ALTER TABLE asyncq_jobs ADD COLUMN turn bigint;

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
                   EXISTS (SELECT FROM asyncq_fair_tasks f WHERE f.task_name = l.task_name) AS fair,
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
             WHERE room.room > 0 AND room.group_concurrency IS NULL AND NOT room.fair
        ),
        -- A task whose jobs are deferred in groups (asyncq_fair_tasks): its grouped jobs in
        -- the order of their turns (given as they are deferred: round-robin over the groups,
        -- see insert_grouped), and its jobs without a turn among the first `room` of its
        -- ready ones, first.
        fair AS MATERIALIZED (
            SELECT u.id, u.priority, u.run_at, u.group_key, room.task_name, room.room,
                   room.group_concurrency, u.loose, u.turn
              FROM room
             CROSS JOIN LATERAL (
                    (SELECT id, priority, run_at, group_key, false AS loose, turn
                       FROM asyncq_jobs
                      WHERE status = 'queued' AND turn IS NOT NULL AND run_at <= now()
                        AND task_name BETWEEN room.task_name AND room.task_name
                        AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                        AND array_position(v_paused, queue) IS NULL
                        AND (room.group_concurrency IS NULL
                             OR group_key <> ALL(ARRAY(SELECT r.group_key FROM running r
                                                        WHERE r.task_name = room.task_name
                                                          AND r.group_key IS NOT NULL
                                                          AND r.n >= room.group_concurrency)))
                      ORDER BY task_name, priority DESC, turn, id
                      LIMIT least(p_scan, room.room * coalesce(room.group_concurrency, 1)))
                    UNION ALL
                    (SELECT h.id, h.priority, h.run_at, h.group_key, true, NULL::bigint
                       FROM (SELECT id, priority, run_at, group_key, turn
                               FROM asyncq_jobs
                              WHERE status = 'queued' AND run_at <= now()
                                AND task_name BETWEEN room.task_name AND room.task_name
                                AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
                                AND array_position(v_paused, queue) IS NULL
                              ORDER BY task_name, priority DESC, run_at, id
                              LIMIT room.room) AS h
                      WHERE h.turn IS NULL
                      LIMIT room.room)) AS u
             WHERE room.room > 0 AND room.fair
        ),
        fair_in_order AS MATERIALIZED (
            SELECT id, priority, run_at
              FROM (SELECT f.id, f.priority, f.run_at, f.room,
                           row_number() OVER (PARTITION BY f.task_name
                                              ORDER BY f.priority DESC, f.loose DESC, f.turn, f.id)
                               AS turn_in_task
                      FROM fair f
                     WHERE f.group_concurrency IS NULL) AS t
             WHERE t.turn_in_task <= t.room
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
             WHERE room.room > 0 AND room.group_concurrency IS NOT NULL AND NOT room.fair
            UNION ALL
            SELECT f.id, f.priority, f.run_at, f.group_key, f.task_name, f.room, f.group_concurrency
              FROM fair f
             WHERE f.group_concurrency IS NOT NULL
        ),
        in_group_order AS (
            SELECT c.*,
                   row_number() OVER (PARTITION BY c.task_name, c.group_key
                                      ORDER BY c.priority DESC, c.id) AS place,
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
                            UNION ALL SELECT id, priority, run_at, true FROM fair_in_order
                            UNION ALL SELECT id, priority, run_at, true
                                        FROM in_task_order WHERE turn <= room)
                           AS candidate) AS counted
             WHERE NOT is_limited OR limited_so_far <= p_limited
             ORDER BY priority DESC, run_at, id
             LIMIT p_limit
        ),
        chosen AS MATERIALIZED (
            SELECT j.id, j.task_name, j.turn
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
        -- The turn a fair task has reached: the next job deferred in a group that has none
        -- queued takes the turn after it, ahead of the backlogs of the other groups.
        served AS (
            UPDATE asyncq_fair_tasks f
               SET served = m.turn
              FROM (SELECT c.task_name, max(c.turn) AS turn
                      FROM chosen c WHERE c.turn IS NOT NULL GROUP BY c.task_name) AS m
             WHERE f.task_name = m.task_name AND f.served < m.turn
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

END
$migration$;
