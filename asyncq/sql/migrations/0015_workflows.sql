-- Work that spans jobs: steps, durable sleeps and waits, events, children, dependencies.
--
-- A job that suspends itself (a sleep, a wait for an event or for other jobs) or that
-- waits for other jobs to end before it runs (options(after=...)) is `waiting`: outside
-- the ready indexes, never claimed, holding no slot. `run_at` is then when it is due
-- anyway ('infinity': never): the end of a sleep, a wait's timeout. `waiting_for` says
-- what for: 'sleep', 'event:<key>', 'jobs' (a gather), 'after' (its dependencies).
--
-- Every write of a running job's step, sleep, wait or child is fenced as its outcome is:
-- it happens only while the job is running by the claim and the worker that write it,
-- with the job's row locked until the write commits, so that no rescuer can take the job
-- back in between. A worker that lost its lease writes nothing.
--
-- Waiting for jobs (a gather, `after`) is an edge per job waited for (asyncq_waits). The
-- edges are made with the jobs waited for locked (FOR SHARE), so that none of them ends
-- in between; each statement that ends jobs with `awaited` set removes their edges, and
-- wakes the waiters that have none left (asyncq_release_waiters). `awaited` is false for
-- nearly every job: the statements that end jobs look for edges only when it is set.
--
-- Safe beside workers of the previous version: the new columns are nullable or have a
-- constant default, they never see a waiting job (it is not queued), and the functions
-- they call keep their arguments and their columns.

ALTER TABLE asyncq_jobs
    ADD COLUMN parent_id     bigint,          -- the job that spawned this one (ctx.spawn)
    ADD COLUMN after         bigint[],        -- options(after=...): the jobs it runs after
    ADD COLUMN after_failure text,            -- 'cancel' or 'run': when one of them did not end done
    ADD COLUMN waiting_for   text,            -- while waiting: what for
    ADD COLUMN awaited       boolean NOT NULL DEFAULT false;  -- a job may wait for this one

-- Checkpoints: the results of a job's steps, keyed by name and by the order of the calls
-- of one name in a run, never by the order of all calls: code may change between deploys
-- as long as the names stay. `position` orders them as they were recorded (a retry from a
-- step drops it and every later one). Sleeps, waits and spawns record theirs here too,
-- under names of their own ('asyncq.sleep', 'asyncq.wait:<key>', 'asyncq.spawn:<task>').
CREATE TABLE asyncq_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    seq         int         NOT NULL,
    position    bigint      GENERATED ALWAYS AS IDENTITY,
    result      jsonb,
    attempt     int         NOT NULL,
    claim       bigint      NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name, seq)
);
ALTER TABLE asyncq_steps SET (autovacuum_vacuum_scale_factor = 0.01,
                              autovacuum_analyze_scale_factor = 0.02);

-- Events: the first emit of a key wins and is kept.
CREATE TABLE asyncq_events (
    key        text        PRIMARY KEY,
    payload    jsonb,
    emitted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX asyncq_events_emitted ON asyncq_events (emitted_at);

-- Job `job_id` waits for job `on_id` to end.
CREATE TABLE asyncq_waits (
    on_id  bigint NOT NULL,
    job_id bigint NOT NULL,
    PRIMARY KEY (on_id, job_id)
);
CREATE INDEX asyncq_waits_job ON asyncq_waits (job_id);

DO $migration$
BEGIN
    -- The waiters p_waiters, whose edges may all be gone: each one left with none is
    -- woken (a gather: queued; a job after others: queued, or cancelled when one of them
    -- did not end done and it runs only after success). They are locked before they are
    -- looked at, and looked at by a statement of its own, whose snapshot sees the edges
    -- other transactions removed while this one waited for the locks: of two jobs that
    -- end at once, the second to take the lock wakes their waiter. Returns the jobs it
    -- cancelled that may be waited for in turn.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_wake_waiters(p_waiters bigint[])
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ids bigint[];
        v_failed text[];
        v_cancelled bigint[];
    BEGIN
        PERFORM 1 FROM asyncq_jobs l WHERE l.id = ANY(p_waiters) ORDER BY l.id
            FOR NO KEY UPDATE;
        -- Read by id, in the order of the ids (which only the primary key gives: sorts
        -- are off), and the jobs they ran after by id, their state compared as text: the
        -- partial indexes of states fit these conditions too, and a plan made on the
        -- statistics of an empty table may pick one and read all of it.
        SELECT array_agg(d.id ORDER BY d.id), array_agg(d.failed ORDER BY d.id)
          INTO v_ids, v_failed
          FROM (SELECT j.id,
                       (SELECT CASE WHEN count(*) > 0
                                    THEN format('Cancelled: it runs after job %%s, which'
                                                || ' ended %%s', min(p.id),
                                                (array_agg(p.status ORDER BY p.id))[1])
                               END
                          FROM asyncq_jobs p
                         WHERE j.waiting_for = 'after' AND j.after_failure = 'cancel'
                           AND p.id = ANY(j.after)
                           AND p.status::text IN ('failed', 'cancelled')) AS failed
                  FROM asyncq_jobs j
                 WHERE j.id = ANY(p_waiters) AND j.status = 'waiting'
                   AND j.waiting_for IN ('jobs', 'after')
                   AND NOT EXISTS (SELECT 1 FROM asyncq_waits w WHERE w.job_id = j.id)
                 ORDER BY j.id) AS d;
        IF v_ids IS NULL THEN
            RETURN NULL;
        END IF;
        WITH woken AS (
            UPDATE asyncq_jobs AS j
               SET status = CASE WHEN v_failed[width_bucket(j.id, v_ids)] IS NULL THEN 'queued'
                                 ELSE 'cancelled' END::asyncq_job_status,
                   finished_at = CASE WHEN v_failed[width_bucket(j.id, v_ids)] IS NOT NULL
                                      THEN now() END,
                   last_error = coalesce(v_failed[width_bucket(j.id, v_ids)], j.last_error),
                   run_at = now(), waiting_for = NULL
             WHERE j.id = ANY(v_ids)
            RETURNING j.id, j.status, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
                   FILTER (WHERE status = 'cancelled')) FROM woken
        )
        SELECT array_agg(w.id) FILTER (WHERE w.status = 'cancelled' AND w.awaited)
          INTO v_cancelled
          FROM woken w CROSS JOIN announced;
        RETURN v_cancelled;
    END
    $function$
    $sql$, current_schema());

    -- The jobs in p_ended have just ended in this transaction (done, failed, cancelled)
    -- and may be waited for: their edges go, and their waiters are woken if they have
    -- none left (asyncq_wake_waiters); a waiter so cancelled may be waited for in turn.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_release_waiters(p_ended bigint[])
    RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[] := p_ended;
        v_waiters bigint[];
    BEGIN
        WHILE cardinality(v_ended) > 0 LOOP
            WITH gone AS (
                DELETE FROM asyncq_waits w WHERE w.on_id = ANY(v_ended) RETURNING w.job_id
            )
            SELECT array_agg(DISTINCT g.job_id) INTO v_waiters FROM gone g;
            EXIT WHEN v_waiters IS NULL;
            v_ended := asyncq_wake_waiters(v_waiters);
        END LOOP;
    END
    $function$
    $sql$, current_schema());

    -- The writes that end jobs (migration 0013), each now also releasing the waiters of
    -- the jobs it ended that may be waited for. Each reads its rows by id in the order of
    -- the ids (an index scan of the primary key, never a bitmap scan, which takes the rows
    -- in the order of their places in the table), so that it locks them in the order a
    -- suspension or a job deferred after others locks the jobs it waits for: a gather of
    -- running children and the write of some of them done, each holding rows the other
    -- came to next, were a deadlock, a second's wait and a retry.
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_mark_done(p_worker text, p_ids bigint[], p_claims bigint[])
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
               SET status = 'done', finished_at = now(), expires_at = NULL
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

    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_mark_done_results(p_worker text, p_ids bigint[],
                                                        p_claims bigint[], p_results text[])
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
                   result = (p_results[width_bucket(j.id, p_ids)])::jsonb
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
                   expires_at = NULL
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
    CREATE OR REPLACE FUNCTION asyncq_mark_cancelled(p_worker text, p_ids bigint[],
                                                     p_claims bigint[])
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
                                       j.attempts, j.max_attempts)
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
    CREATE OR REPLACE FUNCTION asyncq_release(p_worker text, p_ids bigint[], p_claims bigint[],
                                              p_free int)
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
                   expires_at = NULL
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

    -- Done jobs past their retention, oldest first, with their steps and the edges of
    -- any job that still waited for them; returns how many were deleted.
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_prune_done(p_retention interval, p_limit int)
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_pruned bigint[];
    BEGIN
        WITH pruned AS (
            DELETE FROM asyncq_jobs
             WHERE id = ANY(ARRAY(SELECT d.id FROM asyncq_jobs d
                                   WHERE d.status = 'done' AND d.finished_at < now() - p_retention
                                   ORDER BY d.finished_at
                                   LIMIT p_limit))
            RETURNING id
        )
        SELECT array_agg(p.id) INTO v_pruned FROM pruned p;
        IF v_pruned IS NOT NULL THEN
            DELETE FROM asyncq_steps s WHERE s.job_id = ANY(v_pruned);
        END IF;
        RETURN QUERY SELECT coalesce(cardinality(v_pruned), 0)::bigint;
    END
    $function$
    $sql$, current_schema());

    -- Events emitted before the retention, for the pruner.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_prune_events(p_retention interval, p_limit int)
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
            DELETE FROM asyncq_events
             WHERE key = ANY(ARRAY(SELECT e.key FROM asyncq_events e
                                    WHERE e.emitted_at < now() - p_retention
                                    ORDER BY e.emitted_at
                                    LIMIT p_limit))
            RETURNING 1
        )
        SELECT count(*) FROM pruned;
    END
    $function$
    $sql$, current_schema());

    -- The checkpoints of running jobs' steps, in one statement for the steps of many
    -- jobs: each written only while its job is running by the claim and worker that
    -- write it (its row locked until the write commits). Returns each step given, with
    -- the result stored for it ('written' by this call, 'exists' from an earlier one whose
    -- answer was lost, 'lost' with the job's lease).
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_write_steps(p_worker text, p_ids bigint[], p_claims bigint[],
                                       p_names text[], p_seqs int[], p_results text[],
                                       p_attempts int[], p_started timestamptz[])
    RETURNS TABLE (step_job bigint, step_name text, step_seq int, step_state text,
                   step_result text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_held bigint[];
    BEGIN
        SELECT array_agg(h.id) INTO v_held
          FROM (SELECT j.id FROM asyncq_jobs j
                 WHERE j.id = ANY(p_ids)
                   AND j.claims = p_claims[width_bucket(j.id, p_ids)]
                   AND j.status = 'running' AND j.locked_by = p_worker
                 ORDER BY j.id
                   FOR SHARE) AS h;
        RETURN QUERY
        WITH given AS (
            SELECT g.id, g.name, g.seq, g.result, g.attempt, g.claim, g.started
              FROM unnest(p_ids, p_names, p_seqs, p_results, p_attempts, p_claims, p_started)
                   AS g(id, name, seq, result, attempt, claim, started)
        ), written AS (
            INSERT INTO asyncq_steps AS s (job_id, name, seq, result, attempt, claim, started_at)
            SELECT g.id, g.name, g.seq, g.result::jsonb, g.attempt, g.claim, g.started
              FROM given g
             WHERE g.id = ANY(v_held)
            ON CONFLICT (job_id, name, seq) DO NOTHING
            RETURNING s.job_id, s.name, s.seq
        )
        SELECT g.id, g.name, g.seq,
               CASE WHEN w.job_id IS NOT NULL THEN 'written'
                    WHEN g.id = ANY(v_held) THEN 'exists'
                    ELSE 'lost' END,
               CASE WHEN w.job_id IS NULL AND g.id = ANY(v_held)
                    THEN (SELECT s.result::text FROM asyncq_steps s
                           WHERE s.job_id = g.id AND s.name = g.name AND s.seq = g.seq) END
          FROM given g
          LEFT JOIN written w ON w.job_id = g.id AND w.name = g.name AND w.seq = g.seq;
    END
    $function$
    $sql$, current_schema());

    -- The checkpoints of a job, read when it runs again.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_job_steps(p_id bigint)
    RETURNS TABLE (step_name text, step_seq int, step_result text)
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT s.name, s.seq, s.result::text FROM asyncq_steps s WHERE s.job_id = p_id;
    END
    $function$
    $sql$, current_schema());

    -- A step of ctx.step_tx: its checkpoint, written last in the transaction of the step's
    -- own statements, fenced ('written', 'exists' with the result stored before, 'lost').
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_write_step_in_transaction(p_worker text, p_id bigint, p_claim bigint,
                                                     p_name text, p_seq int, p_result text,
                                                     p_attempt int, p_started timestamptz)
    RETURNS TABLE (step_state text, step_result text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        RETURN QUERY
        SELECT s.step_state, s.step_result
          FROM asyncq_write_steps(p_worker, ARRAY[p_id], ARRAY[p_claim], ARRAY[p_name],
                                  ARRAY[p_seq], ARRAY[p_result], ARRAY[p_attempt],
                                  ARRAY[p_started]) AS s;
    END
    $function$
    $sql$, current_schema());

    -- A running job suspends itself: until p_until (a sleep: its end, or now() plus
    -- p_seconds), until the event p_key is emitted (or its timeout, p_until), or until
    -- the jobs p_awaited have ended. Its step (a sleep's end, a wait's timeout) is
    -- recorded with it. Returns what happened: 'waiting' (suspended: the attempt does not
    -- count), or why the job goes on at once instead: 'due' (the sleep is over),
    -- 'emitted' (with the event's payload), 'timeout', 'ended' (the jobs waited for all
    -- ended); 'lost' (the job's lease). With the time it is due for ('sleep', a wait's
    -- timeout). A wait and an emit of one key take the key's lock, so that one of them
    -- sees the other.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_suspend(p_worker text, p_id bigint, p_claim bigint, p_kind text,
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
        v_unmarked bigint[];
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
            SELECT array_agg(w.id), array_agg(w.id) FILTER (WHERE NOT w.awaited)
              INTO v_live, v_unmarked
              FROM (SELECT a.id, a.awaited FROM asyncq_jobs a
                     WHERE a.id = ANY(p_awaited)
                       AND a.status IN ('queued', 'running', 'waiting')
                     ORDER BY a.id
                       FOR SHARE) AS w;
            IF v_live IS NULL THEN
                RETURN QUERY SELECT 'ended'::text, NULL::text, NULL::timestamptz;
                RETURN;
            END IF;
            -- Children are spawned awaited: only the other jobs waited for are marked.
            IF v_unmarked IS NOT NULL THEN
                UPDATE asyncq_jobs a SET awaited = true WHERE a.id = ANY(v_unmarked);
            END IF;
            INSERT INTO asyncq_waits (on_id, job_id)
            SELECT l, p_id FROM unnest(v_live) AS l
            ON CONFLICT DO NOTHING;
            v_until := NULL;
        END IF;
        UPDATE asyncq_jobs j
           SET status = 'waiting',
               waiting_for = CASE p_kind WHEN 'event' THEN 'event:' || p_key ELSE p_kind END,
               run_at = coalesce(v_until, 'infinity'), attempts = j.attempts - 1,
               expires_at = NULL
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

    -- An event emitted: kept if it is the key's first (then True), and the jobs waiting
    -- for it are queued. In the caller's transaction when it gives one. It runs with the
    -- rights of the schema's owner (and only roles granted EXECUTE may call it), so that a
    -- producer that emits needs no right to change jobs' states.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_emit_event(p_key text, p_payload text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('asyncq.event.' || current_schema() || '.'
                                               || p_key));
        INSERT INTO asyncq_events (key, payload) VALUES (p_key, p_payload::jsonb)
        ON CONFLICT (key) DO NOTHING;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        UPDATE asyncq_jobs j SET status = 'queued', run_at = now(), waiting_for = NULL
         WHERE j.status = 'waiting' AND j.waiting_for = 'event:' || p_key;
        RETURN true;
    END
    $function$
    $sql$, current_schema());

    -- Waiting jobs whose time has come (a sleep's end, a wait's timeout), queued; the
    -- trigger of requeued jobs wakes the workers. Returns how many.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_wake_due(p_limit int)
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
        WITH due AS MATERIALIZED (
            SELECT d.id FROM asyncq_jobs d
             WHERE d.status = 'waiting' AND d.run_at <= now() AND d.run_at < 'infinity'
             ORDER BY d.run_at
             LIMIT p_limit
               FOR NO KEY UPDATE SKIP LOCKED
        ), woken AS (
            UPDATE asyncq_jobs j SET status = 'queued', waiting_for = NULL
             WHERE j.id = ANY(ARRAY(SELECT d.id FROM due d))
            RETURNING 1
        )
        SELECT count(*) FROM woken;
    END
    $function$
    $sql$, current_schema());

    -- Seconds until the next waiting job comes due (NULL: none), for a worker that
    -- (re)connects and may have missed its notification.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_next_wake()
    RETURNS float8
    LANGUAGE plpgsql STABLE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_seconds float8;
    BEGIN
        SELECT extract(epoch FROM d.run_at - now())::float8 INTO v_seconds
          FROM asyncq_jobs d
         WHERE d.status = 'waiting' AND d.run_at < 'infinity'
         ORDER BY d.run_at
         LIMIT 1;
        RETURN v_seconds;
    END
    $function$
    $sql$, current_schema());

    -- Lost wake-ups, found by the maintenance: edges to jobs that have ended (by a
    -- statement that did not release their waiters: a worker of an earlier version, say)
    -- or that are gone, released as the end of those jobs would have; and waiters left
    -- with no edge that still wait, woken. Returns the jobs released or woken.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_wake_lost(p_limit int)
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ended bigint[];
        v_stuck bigint[];
        v_cancelled bigint[];
    BEGIN
        -- Each edge's job is looked up by id (a subquery, not a join: the plan of a join
        -- made on an empty table's statistics read every job).
        SELECT array_agg(DISTINCT e.on_id) INTO v_ended
          FROM (SELECT w.on_id FROM asyncq_waits w
                 WHERE coalesce((SELECT j.status::text FROM asyncq_jobs j WHERE j.id = w.on_id),
                                'gone') NOT IN ('queued', 'running', 'waiting')
                 LIMIT p_limit) AS e;
        IF v_ended IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_ended);
        END IF;
        -- In the order of what they wait for, which only the index of it gives (sorts are
        -- off): no plan reads the whole table for the few it finds.
        SELECT array_agg(d.id) INTO v_stuck
          FROM (SELECT w.id FROM asyncq_jobs w
                 WHERE w.status = 'waiting' AND w.waiting_for IN ('jobs', 'after')
                   AND NOT EXISTS (SELECT 1 FROM asyncq_waits e WHERE e.job_id = w.id)
                 ORDER BY w.waiting_for
                 LIMIT p_limit) AS d;
        IF v_stuck IS NOT NULL THEN
            v_cancelled := asyncq_wake_waiters(v_stuck);
            IF v_cancelled IS NOT NULL THEN
                PERFORM asyncq_release_waiters(v_cancelled);
            END IF;
        END IF;
        RETURN QUERY SELECT unnest(coalesce(v_ended, '{}') || coalesce(v_stuck, '{}'));
    END
    $function$
    $sql$, current_schema());

    -- Child jobs of a running job, spawned once: with their step recorded (their ids),
    -- in one transaction, fenced. A step recorded already (a re-run that did not load it,
    -- or a write whose answer was lost) gives the ids it holds, and nothing is spawned.
    -- NULL: the job's lease is lost. The ids come in the order of the arguments.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_spawn(p_worker text, p_id bigint, p_claim bigint, p_attempt int,
                                 p_step text, p_seq int, p_task_name text, p_queue text,
                                 p_args text, p_priority int, p_max_attempts int)
    RETURNS bigint[]
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_ids bigint[];
        v_stored jsonb;
    BEGIN
        PERFORM 1 FROM asyncq_jobs j
         WHERE j.id = p_id AND j.claims = p_claim AND j.status = 'running'
           AND j.locked_by = p_worker
           FOR SHARE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        SELECT s.result INTO v_stored FROM asyncq_steps s
         WHERE s.job_id = p_id AND s.name = p_step AND s.seq = p_seq;
        IF FOUND THEN
            RETURN ARRAY(SELECT (e)::bigint FROM jsonb_array_elements_text(v_stored) AS e);
        END IF;
        WITH made AS (
            INSERT INTO asyncq_jobs (task_name, queue, args, priority, max_attempts, parent_id,
                                     awaited)
            SELECT p_task_name, p_queue, a.value, p_priority, p_max_attempts, p_id, true
              FROM jsonb_array_elements(p_args::jsonb) WITH ORDINALITY AS a(value, n)
             ORDER BY a.n
            RETURNING id
        )
        SELECT array_agg(m.id ORDER BY m.id) INTO v_ids FROM made m;
        INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)
        VALUES (p_id, p_step, p_seq, to_jsonb(coalesce(v_ids, '{}')), p_attempt, p_claim, now());
        RETURN coalesce(v_ids, '{}');
    END
    $function$
    $sql$, current_schema());

    -- A job deferred after others (options(after=...)): waiting, with an edge to each of
    -- them that has not ended (locked meanwhile, so that none ends in between), or, when
    -- all have ended, queued at once (cancelled, when one did not end done and it runs
    -- only after success). One job per element of the JSON array p_args; their ids. With
    -- the owner's rights, as asyncq_emit_event: a producer may not write a job's state.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_defer_after(p_task_name text, p_queue text, p_args text,
                                       p_priority int, p_max_attempts int, p_after bigint[],
                                       p_failure text)
    RETURNS SETOF bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_live bigint[];
        v_failed text;
        v_ids bigint[];
    BEGIN
        SELECT array_agg(w.id) INTO v_live
          FROM (SELECT a.id FROM asyncq_jobs a
                 WHERE a.id = ANY(p_after) AND a.status IN ('queued', 'running', 'waiting')
                 ORDER BY a.id
                   FOR SHARE) AS w;
        IF v_live IS NULL AND p_failure = 'cancel' THEN
            -- By id, the state as text (as in asyncq_wake_waiters).
            SELECT CASE WHEN count(*) > 0
                        THEN format('Cancelled: it runs after job %%s, which ended %%s',
                                    min(a.id), (array_agg(a.status ORDER BY a.id))[1])
                   END
              INTO v_failed
              FROM asyncq_jobs a
             WHERE a.id = ANY(p_after) AND a.status::text IN ('failed', 'cancelled');
        END IF;
        WITH made AS (
            INSERT INTO asyncq_jobs (task_name, queue, args, priority, max_attempts, after,
                                     after_failure, status, waiting_for, run_at, finished_at,
                                     last_error)
            SELECT p_task_name, p_queue, a.value, p_priority, p_max_attempts, p_after, p_failure,
                   CASE WHEN v_live IS NOT NULL THEN 'waiting'
                        WHEN v_failed IS NOT NULL THEN 'cancelled'
                        ELSE 'queued' END::asyncq_job_status,
                   CASE WHEN v_live IS NOT NULL THEN 'after' END,
                   CASE WHEN v_live IS NOT NULL THEN 'infinity'::timestamptz ELSE now() END,
                   CASE WHEN v_failed IS NOT NULL THEN now() END,
                   v_failed
              FROM jsonb_array_elements(p_args::jsonb) WITH ORDINALITY AS a(value, n)
             ORDER BY a.n
            RETURNING id
        )
        SELECT array_agg(m.id ORDER BY m.id) INTO v_ids FROM made m;
        IF v_live IS NOT NULL THEN
            UPDATE asyncq_jobs a SET awaited = true WHERE a.id = ANY(v_live) AND NOT a.awaited;
            INSERT INTO asyncq_waits (on_id, job_id)
            SELECT l, i FROM unnest(v_live) AS l CROSS JOIN unnest(v_ids) AS i
            ON CONFLICT DO NOTHING;
        END IF;
        RETURN QUERY SELECT unnest(v_ids);
    END
    $function$
    $sql$, current_schema());

    -- Cancel jobs by id, and every unfinished job they spawned, and theirs. A queued or
    -- waiting job becomes cancelled at once; a running one is marked (abort_requested_at)
    -- and its worker told on the wake-up channel (chr(30), its id, ':', its claim): the
    -- worker stops that attempt and writes it cancelled; whatever ends the attempt first
    -- sees the mark and ends the job cancelled too. Returns each job asked about that
    -- exists with what happened: cancelled, aborting, or its status as it was.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_cancel(p_ids bigint[])
    RETURNS TABLE (job_id bigint, job_outcome text)
    LANGUAGE plpgsql VOLATILE
    SET search_path = %I
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_sort = off
    SET jit = off
    AS $function$
    DECLARE
        v_family bigint[];
        v_generation bigint[];
        v_cancelled bigint[];
        v_aborting bigint[];
        v_awaited bigint[];
        v_was text[];
        v_asked bigint[];
    BEGIN
        -- The jobs asked about, the jobs they spawned, and theirs, a generation at a time.
        v_family := p_ids;
        v_generation := p_ids;
        LOOP
            SELECT array_agg(c.id) INTO v_generation
              FROM asyncq_jobs c WHERE c.parent_id = ANY(v_generation);
            EXIT WHEN v_generation IS NULL;
            v_family := v_family || v_generation;
        END LOOP;
        SELECT array_agg(t.id ORDER BY t.id), array_agg(t.status::text ORDER BY t.id)
          INTO v_asked, v_was
          FROM (SELECT j.id, j.status FROM asyncq_jobs j
                 WHERE j.id = ANY(v_family)
                 ORDER BY j.id
                   FOR NO KEY UPDATE) AS t;
        WITH cancelled AS (
            UPDATE asyncq_jobs AS j
               SET status = 'cancelled', finished_at = now(), waiting_for = NULL,
                   last_error = CASE WHEN j.id = ANY(p_ids) THEN j.last_error
                                     ELSE format('Cancelled: its parent, job %%s, was cancelled',
                                                 j.parent_id) END
             WHERE j.id = ANY(v_asked) AND j.status IN ('queued', 'waiting')
            RETURNING j.id, j.awaited
        ), announced AS (
            SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)) FROM cancelled
        )
        SELECT array_agg(c.id), array_agg(c.id) FILTER (WHERE c.awaited)
          INTO v_cancelled, v_awaited
          FROM cancelled c CROSS JOIN announced;
        DELETE FROM asyncq_waits w WHERE w.job_id = ANY(v_cancelled);
        WITH aborting AS (
            UPDATE asyncq_jobs AS j
               SET abort_requested_at = coalesce(j.abort_requested_at, now())
             WHERE j.id = ANY(v_asked) AND j.status = 'running'
            RETURNING j.id, j.claims
        ), told AS (
            SELECT count(pg_notify(asyncq_channel(), chr(30) || a.id || ':' || a.claims)) AS n
              FROM aborting a
        )
        SELECT array_agg(a.id) INTO v_aborting FROM aborting a CROSS JOIN told;
        IF v_awaited IS NOT NULL THEN
            PERFORM asyncq_release_waiters(v_awaited);
        END IF;
        RETURN QUERY
        SELECT t.id, CASE WHEN t.id = ANY(v_cancelled) THEN 'cancelled'
                          WHEN t.id = ANY(v_aborting) THEN 'aborting'
                          ELSE t.was END
          FROM unnest(v_asked, v_was) AS t(id, was)
         WHERE t.id = ANY(p_ids);
    END
    $function$
    $sql$, current_schema());

    -- A job that ended (done, failed or cancelled) runs again: queued, its attempts
    -- reset. With p_from_step, that step (its first call) and every step recorded after
    -- it are forgotten, to run again; the others keep their results. Returns the status
    -- it had (NULL: no such job); a job not ended is left alone.
    EXECUTE format($sql$
    CREATE FUNCTION asyncq_retry(p_id bigint, p_from_step text)
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
               abort_requested_at = NULL, result = NULL, waiting_for = NULL
         WHERE j.id = p_id;
        RETURN QUERY SELECT v_was, v_dropped;
    END
    $function$
    $sql$, current_schema());

    -- The other writes of running jobs by id, in the order of the ids too (see the writes
    -- that end jobs above).
    ALTER FUNCTION asyncq_mark_snoozed SET enable_bitmapscan = off;
    ALTER FUNCTION asyncq_heartbeat SET enable_bitmapscan = off;

    REVOKE ALL ON FUNCTION asyncq_emit_event(text, text) FROM PUBLIC;
    REVOKE ALL ON FUNCTION asyncq_defer_after(text, text, text, int, int, bigint[], text)
        FROM PUBLIC;
END
$migration$;
