-- Every query asyncq runs, as named blocks. store.py loads them by name.
-- With App(schema=...), asyncq_jobs and asyncq_job_status are qualified with that schema.
-- Writes after the claim are fenced: they touch a row only while it is still
-- running as the same attempt, claimed by the same worker.
--
-- The statements a worker repeats (the claims, every write after the claim, the rescuer's
-- and the pruner's) call functions of the schema (migrations 0009, 0012 and 0013), whose
-- plans are the index plans whatever the statistics of the table were when a session
-- first ran them. Every one that can end a job (done, failed, cancelled) announces the
-- ids it ended on the results channel, for `App.result`'s waiters, with one more CTE:
--     WITH ended AS (UPDATE ... RETURNING j.id, j.status), announced AS (
--         SELECT asyncq_notify_ids(asyncq_results_channel(), array_agg(id)
--                FILTER (WHERE status IN ('done', 'failed', 'cancelled'))) FROM ended
--     )
--     SELECT id, status::text FROM ended CROSS JOIN announced
-- (announced is one row, so the join keeps every row of ended, and makes it run.)

-- name: insert_job
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts, unique_key)
VALUES (%(task_name)s, %(queue)s, %(args)s::jsonb, %(priority)s,
        coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)),
        %(max_attempts)s, %(unique_key)s)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id

-- name: insert_job_now
-- One job, ready now, without a unique key: what a plain defer writes. The hottest
-- write, so its parameters come by position, in the order of the columns.
INSERT INTO asyncq_jobs (task_name, queue, args, priority, max_attempts)
VALUES (%s, %s, %s::jsonb, %s, %s)
RETURNING id

-- name: insert_job_later
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts)
VALUES (%(task_name)s, %(queue)s, %(args)s::jsonb, %(priority)s,
        coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), %(max_attempts)s)
RETURNING id

-- name: live_job_with_key
SELECT * FROM asyncq_live_job_with_key(%(unique_key)s::text)

-- name: insert_jobs
-- The jobs' arguments come as one JSON array: one value to send and to parse.
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts)
SELECT %(task_name)s, %(queue)s, a, %(priority)s,
       coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), %(max_attempts)s
  FROM jsonb_array_elements(%(args)s::jsonb) AS a
RETURNING id

-- name: insert_grouped
-- Jobs in a group, one per element of a JSON array. Apart from grouped jobs no insert
-- names group_key, so a role that may not write it can defer every other job. Each job
-- takes its turn among the groups of its task (migration 0025): after the later of the
-- group's last turn and the turn the task's claims have reached. The first grouped defer
-- of a task tells the workers (the limits' notification: they claim it by turns now).
WITH fair AS (
    INSERT INTO asyncq_fair_tasks (task_name) VALUES (%(task_name)s)
    ON CONFLICT (task_name) DO NOTHING
    RETURNING pg_notify(asyncq_channel(), chr(28))
),
turns AS (
    INSERT INTO asyncq_group_turns AS g (task_name, group_key, turn)
    SELECT %(task_name)s, %(group_key)s,
           coalesce((SELECT served FROM asyncq_fair_tasks WHERE task_name = %(task_name)s), 0)
           + jsonb_array_length(%(args)s::jsonb)
    ON CONFLICT (task_name, group_key) DO UPDATE
       SET turn = greatest(g.turn + jsonb_array_length(%(args)s::jsonb), excluded.turn)
    RETURNING g.turn - jsonb_array_length(%(args)s::jsonb) AS before
)
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts, unique_key,
                         group_key, turn)
SELECT %(task_name)s, %(queue)s, a.value, %(priority)s,
       coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), %(max_attempts)s,
       %(unique_key)s, %(group_key)s, t.before + a.n
  FROM jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, n), turns t
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id

-- name: insert_rows
-- Jobs deferred at the same moment by different callers, written by one statement.
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts)
SELECT r.task_name, r.queue, r.args::jsonb, r.priority,
       coalesce(r.run_at, now() + make_interval(secs => r.delay)), r.max_attempts
  FROM unnest(%(task_names)s::text[], %(queues)s::text[], %(args)s::text[],
              %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
              %(max_attempts)s::int[])
       AS r(task_name, queue, args, priority, run_at, delay, max_attempts)
RETURNING id

-- name: insert_traced
-- Jobs deferred with tracing on (App(tracing=True)), one per element of a JSON array (a
-- single defer sends an array of one), each with the trace context of the defer's span.
-- Only traced defers name trace_context, so a role that may not write it can defer
-- every other job.
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts, unique_key,
                         trace_context)
SELECT %(task_name)s, %(queue)s, a, %(priority)s,
       coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), %(max_attempts)s,
       %(unique_key)s, %(trace_context)s::jsonb
  FROM jsonb_array_elements(%(args)s::jsonb) AS a
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id

-- name: insert_grouped_traced
-- insert_grouped with the trace context of the defer's span.
WITH fair AS (
    INSERT INTO asyncq_fair_tasks (task_name) VALUES (%(task_name)s)
    ON CONFLICT (task_name) DO NOTHING
    RETURNING pg_notify(asyncq_channel(), chr(28))
),
turns AS (
    INSERT INTO asyncq_group_turns AS g (task_name, group_key, turn)
    SELECT %(task_name)s, %(group_key)s,
           coalesce((SELECT served FROM asyncq_fair_tasks WHERE task_name = %(task_name)s), 0)
           + jsonb_array_length(%(args)s::jsonb)
    ON CONFLICT (task_name, group_key) DO UPDATE
       SET turn = greatest(g.turn + jsonb_array_length(%(args)s::jsonb), excluded.turn)
    RETURNING g.turn - jsonb_array_length(%(args)s::jsonb) AS before
)
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts, unique_key,
                         group_key, trace_context, turn)
SELECT %(task_name)s, %(queue)s, a.value, %(priority)s,
       coalesce(%(run_at)s, now() + make_interval(secs => %(delay)s)), %(max_attempts)s,
       %(unique_key)s, %(group_key)s, %(trace_context)s::jsonb, t.before + a.n
  FROM jsonb_array_elements(%(args)s::jsonb) WITH ORDINALITY AS a(value, n), turns t
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') DO NOTHING
RETURNING id

-- name: insert_rows_traced
-- insert_rows with each job's trace context (NULL for a defer made outside any trace).
INSERT INTO asyncq_jobs (task_name, queue, args, priority, run_at, max_attempts,
                         trace_context)
SELECT r.task_name, r.queue, r.args::jsonb, r.priority,
       coalesce(r.run_at, now() + make_interval(secs => r.delay)), r.max_attempts,
       r.trace_context::jsonb
  FROM unnest(%(task_names)s::text[], %(queues)s::text[], %(args)s::text[],
              %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
              %(max_attempts)s::int[], %(trace_contexts)s::text[])
       AS r(task_name, queue, args, priority, run_at, delay, max_attempts, trace_context)
RETURNING id

-- name: claim_any
-- The plain claim of a worker, in any queue: migration 0009 holds it (a function, so
-- that it runs on a generic plan), and says how it works; migration 0013 pins its plans
-- to the ready indexes, and claims some queues queue by queue; migration 0017 skips the
-- tasks in %(skip)s (NULL: none), those this worker has found it does not know.
SELECT * FROM asyncq_claim(%(worker)s::text, %(limit)s::int, %(lease)s::interval, NULL,
                           %(skip)s::text[])

-- name: claim_queues
-- The plain claim in the worker's queues (see claim_any).
SELECT * FROM asyncq_claim(%(worker)s::text, %(limit)s::int, %(lease)s::interval,
                           %(queues)s::text[], %(skip)s::text[])

-- name: claim_writing_done
-- A plain claim (any queue with queues NULL) that first writes done the jobs of this
-- worker whose tasks returned nothing to store, as mark_done does, fenced the same way:
-- one statement and one commit instead of two while a worker claims batch after batch.
-- The two touch disjoint rows (running ones are written done, queued ones claimed), and
-- commit or fail together: a claim that fails leaves those jobs running, to be written
-- again. The first column is how many of them were written (NULL the rest when nothing
-- was claimed: the one row then says only that). The claim runs after the writes: it is
-- the inner side of the join, which a join ON true can only loop over.
WITH written AS (
    SELECT count(*) AS written
      FROM asyncq_mark_done(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[])
)
SELECT w.written, c.*
  FROM written w
  LEFT JOIN asyncq_claim(%(worker)s::text, %(limit)s::int, %(lease)s::interval,
                         %(queues)s::text[], %(skip)s::text[]) AS c ON true

-- name: claim_aged
-- Priority aging (the worker's --priority-aging, %(aging)s seconds a level): a queued
-- job's effective priority is its priority plus one for every %(aging)s seconds it has
-- been due, read from run_at (no waiting row is ever written). Within a priority the
-- oldest job is the most aged, so the candidates are the first %(limit)s ready jobs of
-- each priority, found by a skip scan of asyncq_jobs_ready (one look-up per distinct
-- priority; BETWEEN, not =, so that the index gives the order). This claims those of a
-- lower priority whose effective priority is above that of the top priority's oldest
-- job (the one the plain claim takes first), best first; nothing when none is. The
-- plain claims stay as they are: a worker with aging on runs this now and then while
-- its claims come back full (the producer), in a transaction with jit off (the
-- planner's estimate of the skip scan would compile it, for ten times its run time).
WITH RECURSIVE levels AS (
    (SELECT j.priority FROM asyncq_jobs j
      WHERE j.status = 'queued'
      ORDER BY j.priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM asyncq_jobs j
             WHERE j.status = 'queued' AND j.priority < l.priority
             ORDER BY j.priority DESC LIMIT 1)
      FROM levels l
     WHERE l.priority IS NOT NULL
), heads AS MATERIALIZED (
    SELECT h.id, h.priority, h.run_at,
           h.priority + extract(epoch FROM now() - h.run_at) / %(aging)s AS effective
      FROM levels l
     CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at FROM asyncq_jobs j
             WHERE j.status = 'queued' AND j.priority BETWEEN l.priority AND l.priority
               AND j.run_at <= now()
               AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
               AND (%(skip)s::text[] IS NULL OR j.task_name <> ALL(%(skip)s::text[]))
               AND j.queue <> ALL(ARRAY(SELECT q.name FROM asyncq_queues q
                                         WHERE q.paused_at IS NOT NULL))
             ORDER BY j.priority DESC, j.run_at, j.id
             LIMIT %(limit)s) AS h
     WHERE l.priority IS NOT NULL
), top AS (
    SELECT h.priority, h.effective FROM heads h
     ORDER BY h.priority DESC, h.run_at, h.id LIMIT 1
), aged AS MATERIALIZED (
    SELECT h.id FROM heads h
      JOIN top t ON h.priority < t.priority AND h.effective > t.effective
     ORDER BY h.effective DESC, h.id
     LIMIT %(limit)s
), next AS MATERIALIZED (
    SELECT j.id FROM asyncq_jobs j
     WHERE j.id = ANY(ARRAY(SELECT a.id FROM aged a)) AND j.status = 'queued'
       FOR NO KEY UPDATE SKIP LOCKED
), clock AS MATERIALIZED (SELECT clock_timestamp() AS now), claimed AS (
    UPDATE asyncq_jobs AS j
       SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1,
           locked_by = %(worker)s::text, locked_at = clock.now, lease = %(lease)s::interval,
           expires_at = clock.now + %(lease)s::interval, started_at = clock.now
      FROM clock
     WHERE j.id = ANY(ARRAY(SELECT n.id FROM next n))
    RETURNING j.id, j.task_name, j.queue, j.args::text, j.attempts, j.max_attempts,
              j.claims, j.scheduled_at, j.trace_context::text, j.priority, j.run_at
)
SELECT c.id, c.task_name, c.queue, c.args, c.attempts, c.max_attempts, c.claims,
       c.scheduled_at, c.trace_context
  FROM claimed c
 ORDER BY c.priority + extract(epoch FROM now() - c.run_at) / %(aging)s DESC, c.id

-- name: claim_limited
-- The claim of a worker whose App has limited tasks: migration 0007 holds it, and says
-- how it works; of the jobs it claims, at most %(limited)s are limited tasks' (migration
-- 0011). Its rows have no trace_context: NULL, for an App without tracing.
SELECT *, NULL::text AS trace_context FROM asyncq_claim_limited(
    %(worker)s::text, %(limit)s::int, %(lease)s::interval, %(queues)s::text[], %(scan)s::int,
    %(names)s::text[], %(concurrency)s::int[], %(rate)s::int[], %(period)s::float8[],
    %(group_concurrency)s::int[], %(limited)s::int)

-- name: claim_limited_traced
-- claim_limited for an App with tracing: each job's trace_context is looked up by id
-- once the function has claimed the jobs (what the function returns stays as it is, for
-- the workers of schema version 7). The look-up reads with the statement's snapshot,
-- taken before the function ran: a job written after that moment and claimed by this
-- very call comes back without its context (its attempt's span has no link), never
-- without the job.
WITH claimed AS MATERIALIZED (
    SELECT * FROM asyncq_claim_limited(
        %(worker)s::text, %(limit)s::int, %(lease)s::interval, %(queues)s::text[],
        %(scan)s::int, %(names)s::text[], %(concurrency)s::int[], %(rate)s::int[],
        %(period)s::float8[], %(group_concurrency)s::int[], %(limited)s::int)
)
SELECT c.*, (SELECT j.trace_context::text FROM asyncq_jobs j WHERE j.id = c.job_id)
  FROM claimed c

-- name: mark_done
-- Jobs whose tasks returned nothing to store: the path of nearly every job, with no
-- result column to write (migration 0013 holds the function, as it does every write
-- after the claim). Each row is found by "id = ANY" (a look-up in the primary key) and
-- its claim read at its id's place in the arrays: the ids come sorted, by claim where an
-- id comes twice, and width_bucket finds that place by a binary search (the last of an
-- id's places: its latest claim, the only one that can still hold it). Not a join to
-- unnest(ids, claims): an UPDATE copies each row of a joined function into a new tuple
-- (per job at b=100, the server's instructions for a claim and this write: 214.6k ->
-- 145.1k in a table of 3,000 rows).
SELECT * FROM asyncq_mark_done(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[])

-- name: mark_done_results
-- A result is JSON text, or NULL (the task returned None, or its result is not stored).
-- The results travel in binary (%(results)b): as a text-format array each JSON string
-- would be quoted and escaped by the driver, which cost more than the statement itself.
SELECT * FROM asyncq_mark_done_results(%(worker)s::text, %(ids)s::bigint[],
                                       %(claims)s::bigint[], %(results)b::text[])

-- name: mark_done_with
-- Done jobs some of whose tasks logged (or reported progress): each with its result, the
-- records its task logged and the progress it reported last (JSON text, or NULL), kept
-- on the row (migration 0020).
SELECT * FROM asyncq_mark_done_with(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                    %(results)b::text[], %(logs)b::text[],
                                    %(progress)b::text[])

-- name: written_by_claims
-- Of the outcomes the fence refused, those written already by these very claims: a write
-- that committed but whose answer was lost with its connection, tried again. Only this
-- worker writes a row at its claim but for the rescuer, whose write (LeaseExpired, the
-- attempt counted) each kind of outcome tells apart from its own: a done row; a failed
-- attempt's error; a snoozed attempt not counted; a cancel's own message; a hand-back's
-- attempt not counted, or its HandedBack. Returns the status each one left.
SELECT * FROM asyncq_written_by_claims(%(worker)s::text, %(ids)s::bigint[],
                                       %(claims)s::bigint[], %(kinds)s::text[],
                                       %(errors)s::text[], %(attempts)s::int[])

-- name: give_back
-- Jobs of tasks this worker does not know: queued again after %(delay)s seconds, the
-- attempt not counted, `unknown_since` set by the first give-back (migration 0017).
SELECT * FROM asyncq_give_back(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                               %(errors)s::text[], %(delay)s::float8, %(logs)b::text[],
                               %(progress)b::text[])

-- name: fail_unknown
-- Jobs that workers gave back longer ago than the grace, not run by any worker since.
SELECT * FROM asyncq_fail_unknown(%(grace)s::interval, %(limit)s::int)

-- name: mark_failed
-- A failed attempt: back to queued after its backoff, or failed once attempts are used up
-- (or at once when give_up is set), or cancelled when a cancel came while it ran. This
-- write and those below append the attempt's record to the job's history, with what its
-- task logged and its last progress (JSON text, or NULL: migration 0020).
SELECT * FROM asyncq_mark_failed(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                 %(retry_in)s::float8[], %(errors)s::text[],
                                 %(give_up)s::bool[], %(logs)b::text[], %(progress)b::text[])

-- name: mark_snoozed
-- The task asked to run again later: back to queued, the attempt not counted (cancelled,
-- when a cancel came while it ran).
SELECT * FROM asyncq_mark_snoozed(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                  %(after)s::float8[], %(logs)b::text[], %(progress)b::text[])

-- name: mark_cancelled
-- Attempts stopped by a cancel: the job ends cancelled, and is not retried.
SELECT * FROM asyncq_mark_cancelled(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                    %(logs)b::text[], %(progress)b::text[])

-- name: release
-- Hand unfinished jobs back at shutdown. The first hand-backs of a job do not count its
-- attempt; after %(free)s of them each one does (a job longer than the grace period,
-- stopped by every deploy, must not loop forever), and the last fails the job. A job a
-- cancel asked to stop is cancelled instead.
SELECT * FROM asyncq_release(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                             %(free)s::int, %(logs)b::text[], %(progress)b::text[])

-- name: heartbeat
SELECT * FROM asyncq_heartbeat(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[])

-- name: write_progress
-- What running tasks reported last (ctx.progress), JSON text per job, fenced.
SELECT * FROM asyncq_write_progress(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                    %(progress)b::text[])

-- name: aborts_requested
-- The running attempts of this worker that a cancel asked to stop: what a worker without
-- a LISTEN connection (App(listen=False)) reads every poll interval instead of being told.
SELECT * FROM asyncq_aborts_requested(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[])

-- name: at_work
-- Whether the server is at work on the statement of another session, one that waits
-- long for its answer (asked on a new connection, while that one waits): the session
-- with that process id; behind a pooler (its process ids are its own, so this
-- connection's is not this server process's), any session of that application_name.
-- A session blocked writing its answer to a client that does not read it is not at work.
SELECT EXISTS (
    SELECT FROM pg_stat_activity
     WHERE state = 'active' AND wait_event IS DISTINCT FROM 'ClientWrite'
       AND pid <> pg_backend_pid()
       AND CASE WHEN pg_backend_pid() = %(own_pid)s THEN pid = %(pid)s
                ELSE application_name = %(application_name)s END
)

-- name: try_lock
-- The maintenance gate: one worker at a time does a piece of maintenance of a schema.
-- The first statement of the gate's transaction: it bounds its idle time, as limit_idle does.
SELECT pg_try_advisory_xact_lock(hashtext('asyncq.' || %(name)s::text || '.' || %(schema)s::text)),
       set_config('idle_in_transaction_session_timeout', %(idle)s, true)

-- name: limit_idle
-- The first statement of a worker's other transactions: a worker frozen inside one
-- (SIGSTOP, a paused VM) must not hold its locks for longer than this. Set for the
-- transaction only, never for the session: through PgBouncer in transaction mode the
-- session's setting would stay on a server connection that other clients use next, and
-- not follow this client to the next one.
SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, true)

-- name: reap_expired
-- Jobs whose worker stopped renewing the lease: the attempt counts. A job a cancel asked
-- to stop is cancelled.
SELECT * FROM asyncq_reap_expired(%(limit)s::int)

-- name: prune_done
SELECT * FROM asyncq_prune_done(%(retention)s::interval, %(limit)s::int)

-- name: has_ready_by_task
SELECT EXISTS (SELECT FROM pg_indexes
                WHERE schemaname = %(schema)s AND indexname = 'asyncq_jobs_ready_by_task')

-- name: worker_facts
-- What a worker needs to know of the database before it starts: the schema that holds
-- the jobs table (the App's, else the current one), and the server's encoding.
SELECT n.nspname, current_setting('server_encoding')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname = 'asyncq_jobs' AND c.relkind = 'r'
   AND n.nspname = coalesce(%(schema)s::text, current_schema())

-- name: channel
-- The schema's wake-up channel, fixed when it was migrated (migration 0002).
SELECT asyncq_channel()

-- name: next_due
-- Milliseconds until the earliest queued job that is not ready yet comes due: what a
-- worker waits for when it (re)connects, having missed the notifications in between.
SELECT ceil(extract(epoch FROM min(run_at) - now()) * 1000)::bigint
  FROM asyncq_jobs
 WHERE status = 'queued' AND run_at > now()
   AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))

-- name: missing_worker_privileges
-- What the connected role lacks to run a worker: read every column, write the state
-- columns, delete done rows (and their steps) and old events, read the schema version
-- and the paused queues, and remove the edges of the jobs it ends or cancels. (The
-- workers table is not asked for: a worker without it runs, unlisted.)
SELECT 'SELECT (' || a.attname || ')'
  FROM pg_attribute a
 WHERE a.attrelid = %(table)s::regclass AND a.attnum > 0 AND NOT a.attisdropped
   AND NOT has_column_privilege(%(table)s::regclass, a.attnum, 'SELECT')
UNION ALL
SELECT 'UPDATE (' || c || ')'
  FROM unnest(ARRAY['status', 'attempts', 'claims', 'handbacks', 'run_at', 'locked_by',
                    'locked_at', 'lease', 'expires_at', 'last_error', 'finished_at',
                    'abort_requested_at', 'result', 'waiting_for', 'unknown_since',
                    'started_at', 'history', 'progress', 'logs']) AS c
 WHERE NOT has_column_privilege(%(table)s::regclass, c, 'UPDATE')
UNION ALL
SELECT 'DELETE' WHERE NOT has_table_privilege(%(table)s::regclass, 'DELETE')
UNION ALL
SELECT 'SELECT on the migrations table'
 WHERE to_regclass(%(migrations)s) IS NOT NULL
   AND NOT has_table_privilege(to_regclass(%(migrations)s), 'SELECT')
UNION ALL
SELECT 'SELECT on the queue settings table'
 WHERE to_regclass(%(queues)s) IS NOT NULL
   AND NOT has_table_privilege(to_regclass(%(queues)s), 'SELECT')
UNION ALL
SELECT 'SELECT on the result listeners table'
 WHERE to_regclass(%(listeners)s) IS NOT NULL
   AND NOT has_table_privilege(to_regclass(%(listeners)s), 'SELECT')
UNION ALL
SELECT privilege || ' on ' || relation
  FROM unnest(ARRAY[%(steps)s, %(waits)s, %(events)s]) AS relation
 CROSS JOIN unnest(ARRAY['SELECT', 'DELETE']) AS privilege
 WHERE to_regclass(relation) IS NOT NULL
   AND NOT has_table_privilege(to_regclass(relation), privilege)

-- name: missing_scheduler_privileges
-- What the connected role lacks to run the scheduler: declare the schedules, and fire
-- their slots (a job with its schedule and slot, the fired slot, the schedule's last slot).
SELECT need.privilege || ' on ' || need.relation
  FROM (VALUES (%(schedules)s, 'SELECT'), (%(schedules)s, 'INSERT'), (%(schedules)s, 'UPDATE'),
               (%(runs)s, 'SELECT'), (%(runs)s, 'INSERT')) AS need(relation, privilege)
 WHERE NOT has_table_privilege(need.relation::regclass, need.privilege)
UNION ALL
SELECT 'INSERT (' || c || ') on ' || %(table)s
  FROM unnest(ARRAY['task_name', 'queue', 'args', 'priority', 'max_attempts', 'schedule',
                    'scheduled_at']) AS c
 WHERE NOT has_column_privilege(%(table)s::regclass, c, 'INSERT')

-- name: requeue_ids
-- Failed or cancelled jobs back to the queue with their attempts reset. Anything else is
-- left alone (the caller reports it), and so is a job whose unique key a live job holds.
-- Of several jobs sharing a unique key, only the newest comes back: one live job per key.
UPDATE asyncq_jobs AS j
   SET status = 'queued', attempts = 0, handbacks = 0, run_at = now(), finished_at = NULL,
       locked_by = NULL, locked_at = NULL, expires_at = NULL, abort_requested_at = NULL,
       progress = NULL
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('failed', 'cancelled')
   AND NOT EXISTS (SELECT 1 FROM asyncq_jobs AS live
                    WHERE live.unique_key = j.unique_key AND live.status IN ('queued', 'running'))
   AND NOT EXISTS (SELECT 1 FROM asyncq_jobs AS twin
                    WHERE twin.unique_key = j.unique_key AND twin.id > j.id
                      AND twin.id = ANY(%(ids)s::bigint[])
                      AND twin.status IN ('failed', 'cancelled'))
RETURNING j.id

-- name: requeue_failed
UPDATE asyncq_jobs AS j
   SET status = 'queued', attempts = 0, handbacks = 0, run_at = now(), finished_at = NULL,
       locked_by = NULL, locked_at = NULL, expires_at = NULL, abort_requested_at = NULL,
       progress = NULL
 WHERE j.status = 'failed'
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
   AND (%(tasks)s::text[] IS NULL OR j.task_name = ANY(%(tasks)s::text[]))
   AND NOT EXISTS (SELECT 1 FROM asyncq_jobs AS live
                    WHERE live.unique_key = j.unique_key AND live.status IN ('queued', 'running'))
   AND NOT EXISTS (SELECT 1 FROM asyncq_jobs AS twin
                    WHERE twin.unique_key = j.unique_key AND twin.id > j.id
                      AND twin.status = 'failed'
                      AND (%(queues)s::text[] IS NULL OR twin.queue = ANY(%(queues)s::text[]))
                      AND (%(tasks)s::text[] IS NULL OR twin.task_name = ANY(%(tasks)s::text[])))
RETURNING j.id

-- name: job_statuses
SELECT id, status::text FROM asyncq_jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: database_clock
SELECT clock_timestamp()

-- name: declare_schedules
-- A worker's App declares its schedules as it starts: what they run changes, their last
-- slot stays (a new schedule's is its latest slot before now: it starts at its next one).
INSERT INTO asyncq_schedules AS s (name, task_name, cron, tz, kwargs, queue, last_slot)
SELECT d.name, d.task_name, d.cron, d.tz, d.kwargs::jsonb, d.queue, d.last_slot
  FROM unnest(%(names)s::text[], %(task_names)s::text[], %(crons)s::text[], %(tzs)s::text[],
              %(kwargs)s::text[], %(queues)s::text[], %(last_slots)s::timestamptz[])
       AS d(name, task_name, cron, tz, kwargs, queue, last_slot)
ON CONFLICT (name) DO UPDATE
   SET task_name = excluded.task_name, cron = excluded.cron, tz = excluded.tz,
       kwargs = excluded.kwargs, queue = excluded.queue, updated_at = now()
 WHERE (s.task_name, s.cron, s.tz, s.kwargs, s.queue)
       IS DISTINCT FROM (excluded.task_name, excluded.cron, excluded.tz, excluded.kwargs,
                         excluded.queue)

-- name: schedule_slots
SELECT name, last_slot FROM asyncq_schedules WHERE name = ANY(%(names)s::text[])

-- name: fire_schedules
-- The due slots of many schedules, each fired at most once, whatever the number of
-- workers: a schedule's row is locked, and its slot fires only if it is later than the
-- row's last_slot and not later than now(), with the cron the worker computed it by
-- (workers of another version may declare the schedule otherwise). The fired-slot row's
-- primary key (schedule, slot) is the last word: a second one would fail the statement
-- and take its job with it.
-- Returns every schedule asked about: the job fired now, if any, and whether the slot is
-- settled (fired by now, by this statement or another, or not this worker's to fire);
-- an unsettled slot (not yet due by the database's clock) is asked about again.
WITH asked AS (
    SELECT *
      FROM unnest(%(names)s::text[], %(slots)s::timestamptz[], %(crons)s::text[],
                  %(tzs)s::text[], %(priorities)s::int[], %(max_attempts)s::int[])
           AS f(name, slot, cron, tz, priority, max_attempts)
), due AS MATERIALIZED (
    SELECT s.name, s.task_name, s.queue, s.kwargs, f.slot, f.priority, f.max_attempts
      FROM asked AS f
      JOIN asyncq_schedules AS s ON s.name = f.name
     WHERE s.cron = f.cron AND s.tz = f.tz
       AND s.last_slot < f.slot AND f.slot <= now()
       AND NOT EXISTS (SELECT 1 FROM asyncq_schedule_runs AS r
                        WHERE r.schedule = s.name AND r.slot = f.slot)
     ORDER BY s.name  -- rows locked in one order, as declare_schedules writes them
       FOR NO KEY UPDATE OF s
), job AS (
    INSERT INTO asyncq_jobs (task_name, queue, args, priority, max_attempts, schedule,
                             scheduled_at)
    SELECT task_name, coalesce(queue, 'default'), kwargs, priority, max_attempts, name, slot
      FROM due
    RETURNING id, schedule, scheduled_at
), run AS (
    INSERT INTO asyncq_schedule_runs (schedule, slot, job_id)
    SELECT schedule, scheduled_at, id FROM job
    RETURNING schedule, slot, job_id
), moved AS (
    UPDATE asyncq_schedules AS s
       SET last_slot = run.slot, last_job_id = run.job_id, updated_at = now()
      FROM run
     WHERE s.name = run.schedule
    RETURNING s.name, run.job_id
)
SELECT f.name, moved.job_id,
       moved.name IS NOT NULL OR s.name IS NULL OR s.last_slot >= f.slot
       OR (s.cron, s.tz) IS DISTINCT FROM (f.cron, f.tz)
       OR EXISTS (SELECT 1 FROM asyncq_schedule_runs AS r
                   WHERE r.schedule = f.name AND r.slot = f.slot) AS settled
  FROM asked AS f
  LEFT JOIN asyncq_schedules AS s ON s.name = f.name
  LEFT JOIN moved ON moved.name = f.name

-- name: list_schedules
-- Every schedule in the table, with its last job's status (NULL once that job is pruned),
-- and the database's time.
SELECT s.name, s.task_name, s.cron, s.tz, s.queue, s.last_slot, s.last_job_id,
       j.status::text, clock_timestamp()
  FROM asyncq_schedules AS s
  LEFT JOIN asyncq_jobs AS j ON j.id = s.last_job_id
 ORDER BY s.name

-- name: cancel
-- Cancel jobs by id, and every unfinished job they spawned (migration 0015): a queued or
-- waiting job becomes cancelled at once; a running one is marked and its worker told.
-- Returns each job found with what happened: cancelled, aborting, or its status as it was.
SELECT * FROM asyncq_cancel(%(ids)s::bigint[])

-- name: pause_queue
-- Returns whether the queue was running until now.
INSERT INTO asyncq_queues AS q (name, paused_at) VALUES (%(queue)s, now())
ON CONFLICT (name) DO UPDATE
   SET paused_at = coalesce(q.paused_at, now()), updated_at = now()
RETURNING q.paused_at = now()

-- name: resume_queue
-- Returns whether the queue was paused; wakes the workers of a queue that was.
WITH resumed AS (
    UPDATE asyncq_queues
       SET paused_at = NULL, updated_at = now()
     WHERE name = %(queue)s AND paused_at IS NOT NULL
    RETURNING name
)
SELECT count(pg_notify(asyncq_channel(), name)) > 0 FROM resumed

-- name: paused_queues
SELECT name, paused_at FROM asyncq_queues WHERE paused_at IS NOT NULL ORDER BY name

-- name: set_limits
-- Override limits of a task or a queue (migration 0024): a NULL parameter keeps the
-- override there is (or the code's limit, where there is none). Tells every worker at
-- once, by a notification of the schema's channel that starts with chr(28) (the
-- listener's LIMITS), sent as the transaction commits.
WITH written AS (
    INSERT INTO asyncq_limits AS l (kind, name, concurrency, rate, period, group_concurrency)
    VALUES (%(kind)s, %(name)s, %(concurrency)s, %(rate)s, %(period)s, %(group_concurrency)s)
    ON CONFLICT (kind, name) DO UPDATE
       SET concurrency = coalesce(excluded.concurrency, l.concurrency),
           rate = coalesce(excluded.rate, l.rate),
           period = coalesce(excluded.period, l.period),
           group_concurrency = coalesce(excluded.group_concurrency, l.group_concurrency),
           updated_at = now()
    RETURNING l.kind
)
SELECT count(pg_notify(asyncq_channel(), chr(28))) FROM written

-- name: reset_limits
-- Drop the overrides of a task or a queue: its limits are the code's again. Returns
-- whether there were any; tells the workers as set_limits does.
WITH dropped AS (
    DELETE FROM asyncq_limits WHERE kind = %(kind)s AND name = %(name)s RETURNING kind
)
SELECT count(pg_notify(asyncq_channel(), chr(28))) > 0 FROM dropped

-- name: list_limits
SELECT kind, name, concurrency, rate, period, group_concurrency, updated_at
  FROM asyncq_limits
 ORDER BY kind, name

-- name: fair_tasks
-- The tasks whose jobs have been deferred in groups: claimed by turns (migration 0025).
SELECT task_name FROM asyncq_fair_tasks ORDER BY task_name

-- Listings of the asyncq command and the dashboard. Each state is read through its own
-- index, in that state's natural order, so that a listing reads about as many rows as it
-- shows, whatever the number of done rows.
-- A waiting job's run_at is 'infinity' while nothing but an event or other jobs can wake
-- it: listed as NULL (no time), which Python's datetime cannot hold.

-- name: list_queued
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE status = 'queued'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY priority DESC, run_at, id
 LIMIT %(limit)s

-- name: list_running
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE expires_at IS NOT NULL AND status = 'running'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY expires_at
 LIMIT %(limit)s

-- name: list_waiting
-- The jobs due at a time (a sleep's end, a wait's timeout) in that order, then those that
-- wait for an event or other jobs only, oldest first: all of them are read and sorted
-- (through asyncq_jobs_waiting_for), as few as they are beside the rest.
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE status = 'waiting'
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY run_at, id
 LIMIT %(limit)s

-- name: list_done
-- Newest first; %(before_id)s (NULL: from the newest) pages on after that job. Many jobs
-- end in one batch at the same instant: the id orders them, sorted within each instant
-- as the index hands them over.
WITH after AS (SELECT finished_at, id FROM asyncq_jobs WHERE id = %(before_id)s)
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE status = 'done'
   AND (%(before_id)s::bigint IS NULL
        OR (finished_at <= (SELECT finished_at FROM after)
            AND (finished_at, id) < (SELECT finished_at, id FROM after)))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY finished_at DESC, id DESC
 LIMIT %(limit)s

-- name: list_ended
-- Failed or cancelled jobs (%(status)s), newest first, paged on as list_done is.
WITH after AS (SELECT finished_at, id FROM asyncq_jobs WHERE id = %(before_id)s)
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE status IN ('failed', 'cancelled') AND status = %(status)s::asyncq_job_status
   AND (%(before_id)s::bigint IS NULL
        OR (finished_at <= (SELECT finished_at FROM after)
            AND (finished_at, id) < (SELECT finished_at, id FROM after)))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY finished_at DESC, id DESC
 LIMIT %(limit)s

-- name: list_all
-- Newest first; %(before_id)s (NULL: from the newest) pages on by the primary key.
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task_name = %(task)s)
 ORDER BY id DESC
 LIMIT %(limit)s

-- How many jobs a listing cut short holds ("20 of 57 shown"): its own rows, through its
-- own index, but counted no further than %(at_most)s, so that a count reads at most that
-- many rows however many the table holds. The caller asks for one more than it will
-- name, to know that there are more.

-- name: count_queued
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE status = 'queued'
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- name: count_running
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE expires_at IS NOT NULL AND status = 'running'
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- name: count_waiting
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE status = 'waiting'
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- name: count_done
WITH after AS (SELECT finished_at, id FROM asyncq_jobs WHERE id = %(before_id)s)
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE status = 'done'
       AND (%(before_id)s::bigint IS NULL
            OR (finished_at <= (SELECT finished_at FROM after)
                AND (finished_at, id) < (SELECT finished_at, id FROM after)))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- name: count_ended
WITH after AS (SELECT finished_at, id FROM asyncq_jobs WHERE id = %(before_id)s)
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE status IN ('failed', 'cancelled') AND status = %(status)s::asyncq_job_status
       AND (%(before_id)s::bigint IS NULL
            OR (finished_at <= (SELECT finished_at FROM after)
                AND (finished_at, id) < (SELECT finished_at, id FROM after)))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- name: count_all
SELECT count(*) FROM (
    SELECT FROM asyncq_jobs
     WHERE (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task_name = %(task)s)
     LIMIT %(at_most)s
) AS listed

-- The dashboard's search, and the bulk actions on what it finds. Each of these statements
-- narrows the jobs by the same filter (every part optional): an id, a queue, a state, a
-- task name's prefix, the worker that holds it, a window of creation times, a piece of
-- text in the arguments (any case), and the highest id (a bulk action changes the jobs
-- its preview counted, not those written since). They are planned for the values of each
-- call (never prepared): the parts not given fold away, and a state, spelled out as a
-- constant, reads through that state's partial index.

-- name: search_jobs
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts,
       nullif(run_at, 'infinity'), created_at, finished_at, locked_by, last_error, waiting_for
  FROM asyncq_jobs
 WHERE (%(id)s::bigint IS NULL OR id = %(id)s)
   AND (%(status)s::text IS NULL
        OR (%(status)s = 'queued' AND status = 'queued')
        OR (%(status)s = 'running' AND status = 'running')
        OR (%(status)s = 'waiting' AND status = 'waiting')
        OR (%(status)s = 'done' AND status = 'done')
        OR (%(status)s = 'failed' AND status = 'failed')
        OR (%(status)s = 'cancelled' AND status = 'cancelled'))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR starts_with(task_name, %(task)s))
   AND (%(worker)s::text IS NULL OR locked_by = %(worker)s)
   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
   AND (%(text)s::text IS NULL OR strpos(lower(args::text), lower(%(text)s)) > 0)
   AND (%(up_to)s::bigint IS NULL OR id <= %(up_to)s)
 ORDER BY id DESC
 LIMIT %(limit)s OFFSET %(offset)s

-- name: count_matching
-- How many jobs match, counted no further than %(at_most)s; of those, how many are in
-- one of the states %(eligible)s (NULL: any), counted as far.
SELECT count(*), count(*) FILTER (WHERE %(eligible)s::text[] IS NULL
                                     OR status::text = ANY(%(eligible)s::text[]))
  FROM (SELECT status FROM asyncq_jobs
         WHERE (%(id)s::bigint IS NULL OR id = %(id)s)
   AND (%(status)s::text IS NULL
        OR (%(status)s = 'queued' AND status = 'queued')
        OR (%(status)s = 'running' AND status = 'running')
        OR (%(status)s = 'waiting' AND status = 'waiting')
        OR (%(status)s = 'done' AND status = 'done')
        OR (%(status)s = 'failed' AND status = 'failed')
        OR (%(status)s = 'cancelled' AND status = 'cancelled'))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR starts_with(task_name, %(task)s))
   AND (%(worker)s::text IS NULL OR locked_by = %(worker)s)
   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
   AND (%(text)s::text IS NULL OR strpos(lower(args::text), lower(%(text)s)) > 0)
   AND (%(up_to)s::bigint IS NULL OR id <= %(up_to)s)
         LIMIT %(at_most)s) AS matched

-- name: newest_id
-- The highest id now: a bulk action's preview counts the jobs up to it, and the action
-- changes those only.
SELECT coalesce(max(id), 0) FROM asyncq_jobs

-- name: bulk_batch
-- The next batch of a bulk action: the ids of matching jobs in the states it changes,
-- after %(after)s, in id order.
SELECT id FROM asyncq_jobs
 WHERE (%(id)s::bigint IS NULL OR id = %(id)s)
   AND (%(status)s::text IS NULL
        OR (%(status)s = 'queued' AND status = 'queued')
        OR (%(status)s = 'running' AND status = 'running')
        OR (%(status)s = 'waiting' AND status = 'waiting')
        OR (%(status)s = 'done' AND status = 'done')
        OR (%(status)s = 'failed' AND status = 'failed')
        OR (%(status)s = 'cancelled' AND status = 'cancelled'))
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR starts_with(task_name, %(task)s))
   AND (%(worker)s::text IS NULL OR locked_by = %(worker)s)
   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
   AND (%(text)s::text IS NULL OR strpos(lower(args::text), lower(%(text)s)) > 0)
   AND (%(up_to)s::bigint IS NULL OR id <= %(up_to)s)
   AND status::text = ANY(%(eligible)s::text[])
   AND id > %(after)s
 ORDER BY id
 LIMIT %(batch)s

-- name: bulk_delete
-- Ended jobs by id, with their steps and the waits on them (the edges to jobs that
-- waited for them are gone once they ended). Returns the ids deleted.
WITH gone AS (
    DELETE FROM asyncq_jobs
     WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('done', 'failed', 'cancelled')
    RETURNING id
), steps AS (
    DELETE FROM asyncq_steps WHERE job_id IN (SELECT id FROM gone)
)
SELECT id FROM gone

-- name: bulk_priority
UPDATE asyncq_jobs SET priority = %(priority)s
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'waiting')
RETURNING id

-- name: bulk_move
-- Into another queue: the jobs not running (a running job's limits are its queue's).
UPDATE asyncq_jobs SET queue = %(queue_to)s
 WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('queued', 'waiting', 'failed', 'cancelled')
RETURNING id

-- name: audit_start
-- A bulk action's record, written as it starts: running, no row changed yet.
INSERT INTO asyncq_audit (actor, action, filter, detail, rows, matched, state)
VALUES (%(actor)s, %(action)s, %(filter)s::jsonb, %(detail)s::jsonb, 0, %(matched)s, 'running')
RETURNING id

-- name: audit_progress
-- The rows a running bulk action has changed so far, written in each batch's transaction.
UPDATE asyncq_audit SET rows = %(rows)s, updated_at = now() WHERE id = %(id)s

-- name: audit_heartbeat
-- A running bulk action is still at work (a batch may wait on a lock for a while).
UPDATE asyncq_audit SET updated_at = now() WHERE id = %(id)s AND state = 'running'

-- name: audit_end
UPDATE asyncq_audit SET state = %(state)s, error = %(error)s, updated_at = now()
 WHERE id = %(id)s

-- name: audit_list
-- Newest first; a running record whose action stopped moving its updated_at is shown
-- interrupted (its process died before it ended).
SELECT id, at, actor, action, filter::text, detail::text, rows, matched,
       CASE WHEN state = 'running' AND updated_at < now() - %(stale)s::interval
            THEN 'interrupted' ELSE state END,
       updated_at, error
  FROM asyncq_audit
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: job_detail
SELECT id, task_name, queue, status::text, priority, attempts, max_attempts, claims,
       handbacks, nullif(run_at, 'infinity'), created_at, locked_by, locked_at, expires_at,
       started_at, finished_at, unique_key, group_key, schedule, scheduled_at,
       abort_requested_at, last_error, args::text, result::text, progress::text, logs::text,
       history::text, clock_timestamp()
  FROM asyncq_jobs
 WHERE id = %(id)s

-- name: queue_overview
-- Per queue: ready and scheduled jobs, the age of the oldest ready one, running, waiting,
-- failed, done in the last hour, and whether it is paused (migration 0017).
SELECT * FROM asyncq_queue_states()

-- name: state_counts
-- Every state but done, counted through its index (done rows are most of the table:
-- their number comes from the statistics instead).
SELECT (SELECT count(*) FROM asyncq_jobs WHERE status = 'queued'),
       (SELECT count(*) FROM asyncq_jobs WHERE expires_at IS NOT NULL AND status = 'running'),
       (SELECT count(*) FROM asyncq_jobs WHERE status = 'waiting'),
       (SELECT count(*) FROM asyncq_jobs
         WHERE status IN ('failed', 'cancelled') AND status = 'failed'),
       (SELECT count(*) FROM asyncq_jobs
         WHERE status IN ('failed', 'cancelled') AND status = 'cancelled')

-- name: table_health
-- The jobs table as the statistics collector and the catalog see it.
SELECT s.n_live_tup, s.n_dead_tup, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       s.vacuum_count, s.autovacuum_count, now(),
       pg_relation_size(s.relid), pg_indexes_size(s.relid), pg_total_relation_size(s.relid)
  FROM pg_stat_user_tables AS s
 WHERE s.relid = %(table)s::regclass

-- name: autovacuum_off
-- Whether the server runs autovacuum at all, and asyncq's tables (in the jobs table's
-- schema) on which it is turned off (autovacuum_enabled false in their reloptions, in
-- any spelling a boolean takes).
SELECT current_setting('autovacuum')::boolean,
       ARRAY(SELECT c.relname::text
               FROM pg_class AS c, unnest(c.reloptions) AS o(setting)
              WHERE c.relnamespace = (SELECT relnamespace FROM pg_class
                                       WHERE oid = %(table)s::regclass)
                AND c.relkind = 'r'
                AND left(c.relname, 7) = 'asyncq_'
                AND CASE WHEN split_part(o.setting, '=', 1) = 'autovacuum_enabled'
                         THEN NOT split_part(o.setting, '=', 2)::boolean END
              ORDER BY c.relname)

-- name: index_sizes
SELECT c.relname, pg_relation_size(c.oid)
  FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
 WHERE i.indrelid = %(table)s::regclass
 ORDER BY c.relname

-- name: oldest_snapshot
-- What holds the vacuum horizon of this database back: the oldest snapshot of a session
-- (another than this one), of a replication slot (a physical one holds every database),
-- or of a prepared transaction, with its age.
SELECT * FROM (
    SELECT 'session' AS kind,
           format('pid %%s (%%s, %%s)', pid, coalesce(nullif(application_name, ''), usename),
                  state) AS holder,
           extract(epoch FROM now() - coalesce(xact_start, backend_start))::float8 AS seconds,
           age(backend_xmin) AS xids
      FROM pg_stat_activity
     WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
       AND datname = current_database()
    UNION ALL
    SELECT 'replication slot', slot_name::text, NULL,
           greatest(age(xmin), age(catalog_xmin))
      FROM pg_replication_slots
     WHERE (xmin IS NOT NULL OR catalog_xmin IS NOT NULL)
       AND (database IS NULL OR database = current_database())
    UNION ALL
    SELECT 'prepared transaction', gid, extract(epoch FROM now() - prepared)::float8,
           age(transaction)
      FROM pg_prepared_xacts
     WHERE database = current_database()
) AS holders
 ORDER BY xids DESC
 LIMIT 1

-- name: throughput
-- Jobs that ended in each of the last %(minutes)s minutes, by how they ended.
SELECT date_trunc('minute', finished_at) AS minute, status::text, count(*)
  FROM asyncq_jobs
 WHERE status = 'done' AND finished_at > now() - make_interval(mins => %(minutes)s)
 GROUP BY 1, 2
UNION ALL
SELECT date_trunc('minute', finished_at), status::text, count(*)
  FROM asyncq_jobs
 WHERE status IN ('failed', 'cancelled') AND finished_at > now() - make_interval(mins => %(minutes)s)
 GROUP BY 1, 2
 ORDER BY 1, 2

-- name: queue_history
-- Each queue over the last %(minutes)s clock minutes (slot 0 the oldest; the last the
-- minute now in), from the jobs' own times: per slot, the jobs that became ready (run_at;
-- those ready before the window in slot 0) and those that left the queue (claimed:
-- started_at; cancelled before a claim: finished_at), of the jobs ready at some moment in
-- the window; the jobs done (finished_at); the jobs claimed, with the sum and the longest
-- of their waits from run_at to start. A job retried counts from its latest run_at, and a
-- job pruned not at all (asyncq_queue_samples keep them). Each state read through its own
-- index, as asyncq_queue_states reads it.
WITH clock AS MATERIALIZED (
    SELECT now() AS now, date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1)
           AS start
), jobs AS (
    SELECT j.queue, j.status::text AS status, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j, clock c WHERE j.status = 'done' AND j.finished_at > c.start
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j, clock c
     WHERE j.status IN ('failed', 'cancelled') AND j.finished_at > c.start
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j WHERE j.expires_at IS NOT NULL AND j.status = 'running'
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j WHERE j.status = 'waiting'
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j, clock c WHERE j.status = 'queued' AND j.run_at <= c.now
), spans AS (
    SELECT j.*, CASE WHEN j.status = 'queued' THEN NULL
                     WHEN j.started_at >= j.run_at THEN j.started_at
                     WHEN j.finished_at >= j.run_at THEN j.finished_at END AS left_at
      FROM jobs j
), events AS (
    SELECT s.queue, s.run_at AS at, 1 AS arrived, 0 AS departed, 0 AS done, 0 AS started,
           NULL::float8 AS wait
      FROM spans s, clock c
     WHERE s.run_at <= c.now
       AND ((s.status = 'queued' AND s.left_at IS NULL) OR s.left_at >= c.start)
    UNION ALL
    SELECT s.queue, s.left_at, 0, 1, 0, 0, NULL
      FROM spans s, clock c WHERE s.left_at >= c.start
    UNION ALL
    SELECT s.queue, s.finished_at, 0, 0, 1, 0, NULL
      FROM spans s, clock c WHERE s.status = 'done' AND s.finished_at > c.start
    UNION ALL
    SELECT s.queue, s.started_at, 0, 0, 0, 1, extract(epoch FROM s.started_at - s.run_at)::float8
      FROM spans s, clock c
     WHERE s.status <> 'queued' AND s.started_at >= c.start AND s.started_at >= s.run_at
)
SELECT e.queue,
       least(greatest(floor(extract(epoch FROM e.at - c.start) / 60), 0),
             %(minutes)s - 1)::int AS slot,
       sum(e.arrived)::int, sum(e.departed)::int, sum(e.done)::int, sum(e.started)::int,
       coalesce(sum(e.wait), 0)::float8, max(e.wait)
  FROM events e, clock c
 GROUP BY 1, 2
 ORDER BY 1, 2

-- name: queue_samples
-- The samples (migration 0029) of the last %(minutes)s clock minutes, numbered as
-- queue_history numbers its slots, and whether each was counted after its minute ended.
WITH clock AS MATERIALIZED (
    SELECT date_trunc('minute', now()) - make_interval(mins => %(minutes)s - 1) AS start
)
SELECT s.queue, (extract(epoch FROM s.minute - c.start) / 60)::int AS slot,
       s.sampled_at >= s.minute + interval '1 minute' AS whole,
       s.depth, s.done, s.started, s.wait_sum, s.wait_max
  FROM asyncq_queue_samples s, clock c
 WHERE s.minute >= c.start
 ORDER BY 1, 2

-- name: write_queue_samples
-- The samples of the minute now in and the one before, per queue: the ready and running
-- jobs counted now (%(queues)s, %(depth)s, %(running)s: the queues' overview) for the
-- minute now in; for both, the jobs done, failed and claimed in them, read as
-- queue_history reads them. Never fewer than a sample counted before (see 0029).
WITH clock AS MATERIALIZED (
    SELECT now() AS now, date_trunc('minute', now()) AS current,
           date_trunc('minute', now()) - interval '1 minute' AS start
), jobs AS (
    SELECT j.queue, j.status::text AS status, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j, clock c WHERE j.status = 'done' AND j.finished_at >= c.start
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j, clock c
     WHERE j.status IN ('failed', 'cancelled') AND j.finished_at >= c.start
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j WHERE j.expires_at IS NOT NULL AND j.status = 'running'
    UNION ALL
    SELECT j.queue, j.status::text, j.run_at, j.started_at, j.finished_at
      FROM asyncq_jobs j WHERE j.status = 'waiting'
), events AS (
    SELECT j.queue, date_trunc('minute', j.finished_at) AS minute,
           (j.status = 'done')::int AS done, (j.status = 'failed')::int AS failed,
           0 AS started, NULL::float8 AS wait
      FROM jobs j, clock c WHERE j.finished_at >= c.start AND j.status IN ('done', 'failed')
    UNION ALL
    SELECT j.queue, date_trunc('minute', j.started_at), 0, 0, 1,
           extract(epoch FROM j.started_at - j.run_at)::float8
      FROM jobs j, clock c WHERE j.started_at >= c.start AND j.started_at >= j.run_at
), counted AS (
    SELECT e.queue, e.minute, sum(e.done)::int AS done, sum(e.failed)::int AS failed,
           sum(e.started)::int AS started, coalesce(sum(e.wait), 0)::float8 AS wait_sum,
           max(e.wait) AS wait_max
      FROM events e GROUP BY 1, 2
), counts_now AS (
    SELECT d.queue, c.current AS minute, d.depth, d.running
      FROM unnest(%(queues)s::text[], %(depth)s::int[], %(running)s::int[])
           AS d(queue, depth, running), clock c
), sampled AS (
    SELECT coalesce(n.queue, k.queue) AS queue, coalesce(n.minute, k.minute) AS minute,
           n.depth, n.running, coalesce(k.done, 0) AS done, coalesce(k.failed, 0) AS failed,
           coalesce(k.started, 0) AS started, coalesce(k.wait_sum, 0) AS wait_sum, k.wait_max
      FROM counts_now n FULL JOIN counted k ON k.queue = n.queue AND k.minute = n.minute
)
INSERT INTO asyncq_queue_samples AS s
       (queue, minute, depth, running, done, failed, started, wait_sum, wait_max, sampled_at)
SELECT d.queue, d.minute, d.depth, d.running, d.done, d.failed, d.started, d.wait_sum,
       d.wait_max, c.now
  FROM sampled d, clock c
 ORDER BY 1, 2
ON CONFLICT (queue, minute) DO UPDATE
   SET depth = coalesce(excluded.depth, s.depth),
       running = coalesce(excluded.running, s.running),
       done = greatest(s.done, excluded.done),
       failed = greatest(s.failed, excluded.failed),
       wait_sum = CASE WHEN excluded.started >= s.started THEN excluded.wait_sum
                       ELSE s.wait_sum END,
       started = greatest(s.started, excluded.started),
       wait_max = greatest(s.wait_max, excluded.wait_max),
       sampled_at = excluded.sampled_at

-- name: prune_queue_samples
DELETE FROM asyncq_queue_samples WHERE minute < now() - %(retention)s::interval

-- name: read_snapshot
-- The reads that follow in this transaction see one snapshot and one now(): a page's
-- numbers agree with each other.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: job_endings
-- How each of these jobs ended (done, failed, cancelled); jobs still queued or running
-- come back with their status alone, and unknown ids not at all.
SELECT * FROM asyncq_job_endings(%(ids)s::bigint[])

-- name: results_channel
-- The channel of news of finished jobs (migration 0003).
SELECT asyncq_results_channel()

-- name: results_listening
-- An App's results listener is (still) listening: the statements that end jobs announce
-- them while a row here is less than a minute old.
INSERT INTO asyncq_result_listeners AS l (listener) VALUES (%(listener)s)
ON CONFLICT (listener) DO UPDATE SET seen_at = now()

-- name: results_not_listening
DELETE FROM asyncq_result_listeners WHERE listener = %(listener)s

-- name: testing_advance
-- asyncq.testing's drain moves time forward; returns the jobs it made due. Jobs waiting for
-- a retry or a snooze (queued and claimed before) become due now; with %(scheduled)s, every
-- queued job due later too. Sleeping jobs are queued, the end their sleep recorded moved to
-- now, so that their next run finds it over (asyncq_suspend: 'due'); with %(timeouts)s, so
-- are jobs waiting for an event with a timeout (their next run times the wait out).
-- Waiting jobs already due (a wait's timeout come) are queued, as the waker would.
WITH moved AS MATERIALIZED (
    SELECT j.id, j.waiting_for
      FROM asyncq_jobs j
     WHERE j.status = 'waiting'
       AND (j.waiting_for = 'sleep' OR j.run_at <= now()
            OR (%(timeouts)s AND starts_with(j.waiting_for, 'event:')
                AND j.run_at < 'infinity'))
       AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
       FOR NO KEY UPDATE
), ended AS (
    UPDATE asyncq_steps s
       SET result = jsonb_build_object('until', now())
      FROM moved m
     WHERE s.job_id = m.id
       AND CASE WHEN m.waiting_for = 'sleep' THEN s.name = 'asyncq.sleep'
                ELSE s.name = 'asyncq.wait:' || substr(m.waiting_for, length('event:') + 1) END
       AND (s.result ->> 'until')::timestamptz > now()
), woken AS (
    UPDATE asyncq_jobs j
       SET status = 'queued', run_at = now(), waiting_for = NULL
      FROM moved m
     WHERE j.id = m.id
    RETURNING j.id
), due AS (
    UPDATE asyncq_jobs
       SET run_at = now()
     WHERE status = 'queued' AND run_at > now() AND (claims > 0 OR %(scheduled)s)
       AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    RETURNING id
)
SELECT id FROM woken UNION ALL SELECT id FROM due

-- name: testing_left_ready
-- asyncq.testing's drain, after a pass: the jobs ready now that it left queued, each with
-- whether its queue is paused (else a limit held by jobs running elsewhere kept it back).
SELECT j.id, j.queue, q.paused_at IS NOT NULL
  FROM asyncq_jobs j
  LEFT JOIN asyncq_queues q ON q.name = j.queue
 WHERE j.status = 'queued' AND j.run_at <= now()
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
 ORDER BY j.id

-- name: testing_waiting
-- asyncq.testing's drain, at its end: the jobs left waiting (for an event, for other jobs),
-- each with the jobs it waits for and when it comes due anyway (NULL: never).
SELECT j.id, j.task_name, j.waiting_for, nullif(j.run_at, 'infinity'),
       ARRAY(SELECT w.on_id FROM asyncq_waits w WHERE w.job_id = j.id ORDER BY w.on_id)
  FROM asyncq_jobs j
 WHERE j.status = 'waiting'
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
 ORDER BY j.id

-- name: testing_jobs_of_task
-- Every job of a task, whatever its status, oldest first (asyncq.testing's assertions).
SELECT id, task_name, queue, args::text, status::text, priority, run_at, attempts,
       max_attempts, last_error
  FROM asyncq_jobs
 WHERE task_name = %(task)s
 ORDER BY id

-- name: testing_empty
-- asyncq.testing: a test's schema, emptied for the next test (the migrations stay).
DELETE FROM asyncq_jobs;
DELETE FROM asyncq_queues;
DELETE FROM asyncq_schedule_runs;
DELETE FROM asyncq_schedules;
DELETE FROM asyncq_rate_starts;
DELETE FROM asyncq_result_listeners;
DELETE FROM asyncq_steps;
DELETE FROM asyncq_waits;
DELETE FROM asyncq_events;
DELETE FROM asyncq_workers

-- name: database_exists
-- The embedded server: whether a project's database is there.
SELECT EXISTS (SELECT FROM pg_database WHERE datname = %(name)s)

-- name: create_database
-- The embedded server: a project's database, made on its first use ({name}: an identifier).
CREATE DATABASE {name}


-- Work that spans jobs (migration 0015): every write of a running job is fenced by its
-- claim, as its outcome is.

-- name: write_steps
-- The checkpoints of steps of running jobs, several jobs' in one statement.
SELECT * FROM asyncq_write_steps(%(worker)s::text, %(ids)s::bigint[], %(claims)s::bigint[],
                                 %(names)s::text[], %(seqs)s::int[], %(results)s::text[],
                                 %(attempts)s::int[], %(started)s::timestamptz[])

-- name: write_step_in_transaction
-- ctx.step_tx's checkpoint, last in the transaction of the step's own statements.
SELECT * FROM asyncq_write_step_in_transaction(%(worker)s::text, %(id)s::bigint,
                                               %(claim)s::bigint, %(name)s::text,
                                               %(seq)s::int, %(result)s::text,
                                               %(attempt)s::int, %(started)s::timestamptz)

-- name: job_steps
SELECT * FROM asyncq_job_steps(%(id)s::bigint)

-- name: suspend
SELECT * FROM asyncq_suspend(%(worker)s::text, %(id)s::bigint, %(claim)s::bigint,
                             %(kind)s::text, %(until)s::timestamptz, %(seconds)s::float8,
                             %(key)s::text, %(awaited)s::bigint[], %(step)s::text,
                             %(seq)s::int, %(attempt)s::int)

-- name: spawn
SELECT asyncq_spawn(%(worker)s::text, %(id)s::bigint, %(claim)s::bigint, %(attempt)s::int,
                    %(step)s::text, %(seq)s::int, %(task_name)s::text, %(queue)s::text,
                    %(args)s::text, %(priority)s::int, %(max_attempts)s::int)

-- name: emit_event
SELECT asyncq_emit_event(%(key)s::text, %(payload)s::text)

-- name: wake_due
SELECT * FROM asyncq_wake_due(%(limit)s::int)

-- name: next_wake
SELECT asyncq_next_wake()

-- name: wake_lost
SELECT * FROM asyncq_wake_lost(%(limit)s::int)

-- name: defer_after
SELECT * FROM asyncq_defer_after(%(task_name)s::text, %(queue)s::text, %(args)s::text,
                                 %(priority)s::int, %(max_attempts)s::int,
                                 %(after)s::bigint[], %(failure)s::text)

-- name: retry
SELECT * FROM asyncq_retry(%(id)s::bigint, %(from_step)s::text)

-- name: prune_events
SELECT * FROM asyncq_prune_events(%(retention)s::interval, %(limit)s::int)

-- name: job_workflow
-- What `asyncq job` shows of a job's work beyond itself: its steps in the order they were
-- recorded (the first %(limit)s, how many in all, and every name once, in the order of
-- its first record); its children (the first %(limit)s by id, and how many of each
-- state); the jobs it runs after; what it waits for, and the jobs it still waits for
-- (the first %(limit)s, and how many).
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'name', s.name, 'seq', s.seq, 'attempt', s.attempt,
                   'started_at', s.started_at, 'finished_at', s.finished_at,
                   'result_bytes', octet_length(s.result::text)) ORDER BY s.position), '[]')
          FROM (SELECT * FROM asyncq_steps s WHERE s.job_id = j.id
                 ORDER BY s.position LIMIT %(limit)s) AS s)::text,
       (SELECT count(*) FROM asyncq_steps s WHERE s.job_id = j.id),
       ARRAY(SELECT s.name FROM asyncq_steps s WHERE s.job_id = j.id
              GROUP BY s.name ORDER BY min(s.position)),
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', c.id, 'task', c.task_name,
                                                     'status', c.status) ORDER BY c.id), '[]')
          FROM (SELECT c.id, c.task_name, c.status FROM asyncq_jobs c
                 WHERE c.parent_id = j.id ORDER BY c.id LIMIT %(limit)s) AS c)::text,
       (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{}')
          FROM (SELECT c.status::text, count(*) AS n FROM asyncq_jobs c
                 WHERE c.parent_id = j.id GROUP BY c.status) AS c)::text,
       j.parent_id, j.after, j.after_failure, j.status::text, j.waiting_for,
       nullif(j.run_at, 'infinity'),
       ARRAY(SELECT w.on_id FROM asyncq_waits w WHERE w.job_id = j.id
              ORDER BY w.on_id LIMIT %(limit)s),
       (SELECT count(*) FROM asyncq_waits w WHERE w.job_id = j.id)
  FROM asyncq_jobs j
 WHERE j.id = %(id)s


-- Workers (migration 0020): each has a row while it runs, refreshed every `beat`; a row
-- not refreshed for three beats is a worker that died.

-- name: worker_started
INSERT INTO asyncq_workers AS w (id, host, pid, version, app, queues, concurrency, beat)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(app)s, %(queues)s::text[], %(concurrency)s,
        %(beat)s::interval)
ON CONFLICT (id) DO UPDATE SET seen_at = now()
RETURNING w.started_at

-- name: worker_seen
-- A worker's row refreshed (written again if the maintenance deleted it meanwhile: a
-- worker frozen for long), with how many it runs now; and how many workers are live and
-- how many dead by their rows (this one counted live).
WITH seen AS (
    INSERT INTO asyncq_workers AS w (id, host, pid, version, app, queues, concurrency, beat,
                                     running, started_at)
    VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(app)s, %(queues)s::text[],
            %(concurrency)s, %(beat)s::interval, %(running)s,
            coalesce(%(started)s::timestamptz, now()))
    ON CONFLICT (id) DO UPDATE SET running = excluded.running, seen_at = now()
)
SELECT 1 + count(*) FILTER (WHERE o.seen_at > now() - 3 * o.beat),
       count(*) FILTER (WHERE o.seen_at <= now() - 3 * o.beat)
  FROM asyncq_workers o
 WHERE o.id <> %(id)s

-- name: worker_stopped
DELETE FROM asyncq_workers WHERE id = %(id)s

-- name: list_workers
-- Every worker's row, live ones first, with whether it is live (refreshed within three
-- beats) and how long ago it was last refreshed, by the database's clock.
SELECT id, host, pid, version, app, queues, concurrency, running, started_at, seen_at,
       extract(epoch FROM beat)::float8, seen_at > now() - 3 * beat,
       greatest(extract(epoch FROM now() - seen_at), 0)::float8
  FROM asyncq_workers
 ORDER BY seen_at > now() - 3 * beat DESC, host, started_at, id

-- name: prune_workers
-- The rows of workers not seen for %(after)s (and at least three beats): they died.
DELETE FROM asyncq_workers
 WHERE seen_at < now() - %(after)s::interval AND seen_at < now() - 3 * beat
