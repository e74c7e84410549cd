-- A fan-in (the children of a gather, the jobs one job is deferred after) no longer
-- queues its writes up behind each other.
--
-- Edges at the spawn. A gather used to make its edges to its live children as it
-- suspended, with each of them locked meanwhile (FOR SHARE, in the order of their ids),
-- so that none ended in between: the parent's suspension waited, child by child, for the
-- writes of those being claimed or ended, while the writes of the children it had locked
-- waited for it; a gather of 10,000 children just spawned could hold the workers for
-- most of its children's run. Now a spawn makes the edge to each child as it inserts it
-- (no one can end a child before its spawn commits), and a gather drops the edges to the
-- children it does not wait for and locks only the jobs it waits for that it has no edge
-- to (jobs not its children; children already ended).
--
-- The waiter looked at only when it may be free. Each statement that ends jobs that are
-- waited for removes their edges, then looked at each of their waiters with its row
-- locked (asyncq_wake_waiters): so the writes of a fan-in's children, each holding the
-- parent's row until it committed, ran one after another. Now, first, it takes a lock
-- that shares with other such locks (FOR KEY SHARE) on one of the waiter's edges that no
-- other transaction is removing (SKIP LOCKED), its last (to the job made last, which
-- tends to end last): the waiter then has an edge left, and whoever removes that edge
-- waits for this transaction to commit, and so sees its removals when it looks. Only a
-- statement that finds no such edge locks the waiter and looks, as before.
--
-- Safe beside workers of the previous version: they call these functions by the same
-- names and arguments.
DO $migration$
BEGIN
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_release_waiters(p_ended bigint[])
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
            SELECT array_agg(x.id) INTO v_waiters
              FROM unnest(v_waiters) AS x(id)
             WHERE NOT EXISTS (SELECT FROM (SELECT w.on_id FROM asyncq_waits w
                                             WHERE w.job_id = x.id
                                             ORDER BY w.job_id DESC, w.on_id DESC LIMIT 1
                                               FOR KEY SHARE SKIP LOCKED) AS last_edge);
            EXIT WHEN v_waiters IS NULL;
            v_ended := asyncq_wake_waiters(v_waiters);
        END LOOP;
    END
    $function$
    $sql$, current_schema());

    -- Children are spawned with their edges (migration 0015), which no one else can end
    -- before the spawn commits.
    EXECUTE format($sql$
    CREATE OR REPLACE FUNCTION asyncq_spawn(p_worker text, p_id bigint, p_claim bigint, p_attempt int,
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
        INSERT INTO asyncq_waits (on_id, job_id) SELECT c, p_id FROM unnest(v_ids) AS c;
        INSERT INTO asyncq_steps (job_id, name, seq, result, attempt, claim, started_at)
        VALUES (p_id, p_step, p_seq, to_jsonb(coalesce(v_ids, '{}')), p_attempt, p_claim, now());
        RETURN coalesce(v_ids, '{}');
    END
    $function$
    $sql$, current_schema());

    -- A gather waits on the edges the spawn above made.
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
            -- The edges its spawn made to children it does not wait for now go.
            DELETE FROM asyncq_waits w
             WHERE w.job_id = p_id
               AND NOT EXISTS (SELECT FROM unnest(p_awaited) AS a(id) WHERE a.id = w.on_id);
            -- The jobs it waits for that it has no edge to (they are not its children, or
            -- have ended) are locked while the edges to the live ones are made, so that
            -- none of them ends in between.
            SELECT array_agg(w.id) INTO v_live
              FROM (SELECT a.id FROM asyncq_jobs a
                     WHERE a.id = ANY(ARRAY(
                               SELECT x.id FROM unnest(p_awaited) AS x(id)
                                WHERE NOT EXISTS (SELECT FROM asyncq_waits e
                                                   WHERE e.on_id = x.id AND e.job_id = p_id)))
                       AND a.status IN ('queued', 'running', 'waiting')
                     ORDER BY a.id
                       FOR SHARE) AS w;
            IF v_live IS NOT NULL THEN
                UPDATE asyncq_jobs a SET awaited = true
                 WHERE a.id = ANY(v_live) AND NOT a.awaited;
                INSERT INTO asyncq_waits (on_id, job_id)
                SELECT l, p_id FROM unnest(v_live) AS l
                ON CONFLICT DO NOTHING;
            END IF;
            -- An edge seen here whose job is ending in a transaction not yet committed is
            -- that transaction's to release: it looks at this job under its lock, after
            -- this one commits (asyncq_release_waiters).
            IF NOT EXISTS (SELECT FROM asyncq_waits w WHERE w.job_id = p_id) THEN
                RETURN QUERY SELECT 'ended'::text, NULL::text, NULL::timestamptz;
                RETURN;
            END IF;
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
END
$migration$;
