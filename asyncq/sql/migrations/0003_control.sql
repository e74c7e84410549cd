-- Control of jobs: results, cancel and abort, schedules, groups, queue settings, and the
-- state of rate limits.
--
-- Safe on a live table beside workers of the previous version: the new columns are
-- nullable (no rewrite, no scan), the rest are new tables, and nothing the previous
-- version reads or writes changes form. A job such a worker finishes stores no result
-- and sends no notification: waiters find it by their poll.

ALTER TABLE asyncq_jobs
    ADD COLUMN result             jsonb,        -- what the task returned (done rows)
    ADD COLUMN abort_requested_at timestamptz,  -- a cancel asked the holding worker to stop it
    ADD COLUMN group_key          text,         -- options(group=...): the unit of group_concurrency
    ADD COLUMN schedule           text,         -- the schedule that made the job, and its slot
    ADD COLUMN scheduled_at       timestamptz;

-- Queue settings: a queue with paused_at set is claimed by no worker.
CREATE TABLE asyncq_queues (
    name       text PRIMARY KEY,
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Schedules, as the workers of the App declared them last. last_slot only moves
-- forward: a slot is fired by the statement that moves it, so two workers never fire the
-- same slot, and a slot older than the last one never fires.
CREATE TABLE asyncq_schedules (
    name        text PRIMARY KEY,
    task_name   text NOT NULL,
    cron        text NOT NULL,
    tz          text NOT NULL,
    kwargs      jsonb NOT NULL DEFAULT '{}',
    queue       text,
    last_slot   timestamptz NOT NULL,
    last_job_id bigint,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per fired slot: its primary key is the database's guarantee of one job per
-- schedule and slot (a second insert for the same slot fails, and takes its job with it).
CREATE TABLE asyncq_schedule_runs (
    schedule text        NOT NULL,
    slot     timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    fired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, slot)
);

-- A channel for news of finished jobs, listened to by Apps that wait for results (never
-- by workers, so completions do not wake them): the payload is a comma-separated list of
-- job ids.
DO $migration$
DECLARE
    channel text := CASE WHEN octet_length('asyncq.done.' || current_schema()) <= 63
                         THEN 'asyncq.done.' || current_schema()
                         ELSE 'asyncq.done.' || md5(current_schema()) END;
BEGIN
    EXECUTE format($sql$
        CREATE FUNCTION asyncq_results_channel() RETURNS text
        LANGUAGE sql IMMUTABLE AS $$ SELECT %L::text $$
    $sql$, channel);
END
$migration$;

