-- A fence token that never repeats, a count of hand-backs, wake-ups that say when a job
-- comes due, and a channel name that fits PostgreSQL's 63 bytes for any schema name.
--
-- Safe on a live table beside workers of the previous version: the new columns have
-- constant defaults (no rewrite), those workers neither read nor write them, and the
-- notifications they act on (a queue name, for jobs ready now) keep their form.

-- Claims of this row so far; it only grows (a requeue does not reset it), so the writes
-- of an attempt, fenced on it, can never match another claim of the row.
ALTER TABLE asyncq_jobs ADD COLUMN claims bigint NOT NULL DEFAULT 0;

-- Attempts handed back at a worker's shutdown without counting, since the last requeue.
ALTER TABLE asyncq_jobs ADD COLUMN handbacks int NOT NULL DEFAULT 0;

-- The wake-up channel of this schema, fixed here: "asyncq.<schema>", or "asyncq.<md5 of
-- the name>" when that would not fit a channel name. Workers read it from
-- asyncq_channel(); the triggers have it written in, which makes them cheaper than
-- working it out on every insert.
--
-- Payloads: the queue's name when jobs are ready now (what workers of the previous
-- version read), and the queue's name, the unit separator (chr(31), which no queue name
-- asyncq writes holds) and a number of milliseconds for a job that comes due that long
-- after the writing transaction began (a delayed job, a retry): a worker wakes for it
-- then, instead of at its next poll. A statement that inserts ready jobs pays for one
-- trigger call, as before; a row-level trigger fires only for rows due later.
DO $migration$
DECLARE
    channel text := CASE WHEN octet_length('asyncq.' || current_schema()) <= 63
                         THEN 'asyncq.' || current_schema()
                         ELSE 'asyncq.' || md5(current_schema()) END;
BEGIN
    EXECUTE format($sql$
        CREATE FUNCTION asyncq_channel() RETURNS text
        LANGUAGE sql IMMUTABLE AS $$ SELECT %L::text $$
    $sql$, channel);

    EXECUTE format($sql$
        CREATE OR REPLACE FUNCTION asyncq_notify_inserted() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(%L, q.queue)
               FROM (SELECT DISTINCT queue FROM inserted
                      WHERE status = 'queued' AND run_at <= now()) AS q;
            RETURN NULL;
        END
        $$
    $sql$, channel);

    EXECUTE format($sql$
        CREATE FUNCTION asyncq_notify_later() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(%L, NEW.queue || chr(31)
                                  || ceil(extract(epoch FROM NEW.run_at - now()) * 1000)::bigint);
            RETURN NULL;
        END
        $$
    $sql$, channel);

    EXECUTE format($sql$
        CREATE OR REPLACE FUNCTION asyncq_notify_requeued() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.run_at <= now() THEN
                PERFORM pg_notify(%1$L, NEW.queue);
            ELSE
                PERFORM pg_notify(%1$L, NEW.queue || chr(31)
                                        || ceil(extract(epoch FROM NEW.run_at - now()) * 1000)::bigint);
            END IF;
            RETURN NULL;
        END
        $$
    $sql$, channel);
END
$migration$;

CREATE TRIGGER asyncq_jobs_inserted_later
    AFTER INSERT ON asyncq_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.run_at > now())
    EXECUTE FUNCTION asyncq_notify_later();
