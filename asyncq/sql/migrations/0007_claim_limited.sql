-- The claim of a worker whose App has limited tasks, as one function: it takes the
-- limits lock and then claims, by two statements (the claim's snapshot is taken after
-- the lock, so it sees every job that earlier claims started) in one call from the
-- worker, in one round trip and without a transaction block around it. The lock is held
-- until that call's transaction ends, not while a client sends its COMMIT.
--
-- The lock: claims of limited tasks happen one at a time in a schema (the same key as
-- the workers of schema version 6 take, so that both kinds serialise during a rolling
-- upgrade).
--
-- The settings: the function's statements keep their plans for the session, and the
-- claim's plan is generic (planning it afresh each time, as the server otherwise chooses
-- to, cost as much as running it). A generic plan cannot see the task names, and with
-- skewed statistics (one task holding nearly every ready job) the planner took a
-- sequential scan and a sort of every ready job for the unlimited tasks' few: seqscan and
-- sort are ruled out where an index gives the order, and JIT, which the costs of the
-- ruled-out plans would set off, is turned off. They hold inside the function only.
--
-- The claim: unlimited tasks' jobs are claimed as by claim_any; a limited task's jobs
-- only as far as its room: its concurrency less its running jobs, its rate less its
-- starts in the last period (asyncq_rate_starts), and, per group, the group's
-- concurrency less the group's running jobs. Running rows are exactly those with an
-- expires_at (the asyncq_jobs_leases index). A saturated task or group is skipped, so
-- it holds up no other job. The paused queues are left out with array_position, not a
-- bare "<> ALL": with every job in one queue, the planner takes "<> ALL" of an array it
-- cannot see for a filter that keeps nothing, and scans and sorts the whole table.
-- The candidates are read without locks and only the chosen ones are locked (a lock is
-- a write): the limited claims run one at a time, so none takes another's candidates;
-- a plain claim of another App may, and SKIP LOCKED with the status checked again on
-- the row's latest version leaves those out. A limited task's ready jobs are read from
-- asyncq_jobs_ready_by_task (made by the migration of an App with limits, see
-- migrate.py), not by reading every ready job of the others in search of a rare task's:
-- the task is matched with BETWEEN and ordered by task_name first, which only that
-- index serves without a sort, where the planner could not tell the two indexes apart
-- for "task_name =" of a name its generic plan cannot see.
--
-- Rate-limit starts are kept in buckets of a twentieth of the period (one row per task
-- and bucket, at the bucket's start), not one row per claim: a claim sums at most 21
-- rows, where a row per claim made it sum every claim of the period (tens of thousands
-- for a limit per hour). A bucket is counted while any part of it is in the window, so
-- the count never falls short: a limit is never exceeded, and a task may start up to
-- a twentieth of its rate fewer than it could. (Workers of schema version 6, still
-- running during an upgrade, record a row per claim; both kinds count both kinds of
-- rows, the older ones each only from its own start, so while both run a limit may be
-- exceeded by up to a twentieth.)
--
-- The tables are named by the search path fixed here, as the channel is, so that they
-- are found whatever the search path of the statement that calls it.
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_claim_limited(
        p_worker text, p_limit int, p_lease interval, p_queues text[], p_scan int,
        p_names text[], p_concurrency int[], p_rate int[], p_period float8[],
        p_group_concurrency int[]
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
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('asyncq.limits.' || current_schema()));
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
                   least(p_limit,
                         l.concurrency - (SELECT coalesce(sum(r.n), 0) FROM running r
                                           WHERE r.task_name = l.task_name),
                         l.rate - (SELECT coalesce(sum(s.count), 0) FROM asyncq_rate_starts s, clock
                                    WHERE s.task_name = l.task_name
                                      AND s.started_at > clock.now - make_interval(secs => l.period * 1.05)))
                   AS room
              FROM limits l
        ),
        paused AS MATERIALIZED (
            SELECT ARRAY(SELECT name FROM asyncq_queues WHERE paused_at IS NOT NULL) AS queues
        ),
        unlimited AS MATERIALIZED (
            SELECT id, priority, run_at
              FROM asyncq_jobs
             WHERE status = 'queued' AND run_at <= now()
               AND task_name <> ALL(p_names::text[])
               AND (p_queues::text[] IS NULL OR queue = ANY(p_queues::text[]))
               AND array_position((SELECT queues FROM paused), queue) IS NULL
             ORDER BY priority DESC, run_at, id
             LIMIT p_limit
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
                       AND array_position((SELECT queues FROM paused), queue) IS NULL
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
                       AND array_position((SELECT queues FROM paused), queue) IS NULL
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
              FROM (SELECT id, priority, run_at FROM unlimited
                    UNION ALL SELECT id, priority, run_at FROM limited
                    UNION ALL SELECT id, priority, run_at FROM in_task_order WHERE turn <= room)
                   AS candidate
             ORDER BY priority DESC, run_at, id
             LIMIT p_limit
        ),
        chosen AS MATERIALIZED (
            SELECT j.id, j.task_name
              FROM asyncq_jobs j
             WHERE j.id IN (SELECT id FROM picked) AND j.status = 'queued'
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
