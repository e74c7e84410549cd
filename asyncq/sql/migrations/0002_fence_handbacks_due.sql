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

-- The wake-up channel of a schema: "asyncq.<schema>", or "asyncq.<md5 of it>" when that
-- would not fit a channel name. asyncq's workers ask for it with this same expression
-- (the query "channel" in queries.sql).
--
-- Payloads: the queue's name when jobs are ready now (what workers of the previous
-- version read), and the queue's name, the unit separator (chr(31), which no queue name
-- asyncq writes holds) and a number of milliseconds for jobs that come due that long
-- after the writing transaction began (a delayed job, a retry): a worker wakes for
-- them then, instead of at its next poll.
CREATE OR REPLACE FUNCTION asyncq_notify_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    channel text := 'asyncq.' || TG_TABLE_SCHEMA;
BEGIN
    IF octet_length(channel) > 63 THEN
        channel := 'asyncq.' || md5(TG_TABLE_SCHEMA);
    END IF;
    PERFORM pg_notify(channel, v.payload)
       FROM (SELECT queue, bool_or(run_at <= now()) AS ready,
                    min(run_at) FILTER (WHERE run_at > now()) AS due
               FROM inserted WHERE status = 'queued' GROUP BY queue) AS q,
            LATERAL (VALUES (CASE WHEN q.ready THEN q.queue END),
                            (q.queue || chr(31) || ceil(extract(epoch FROM q.due - now()) * 1000)::bigint)
                    ) AS v(payload)
      WHERE v.payload IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION asyncq_notify_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    channel text := 'asyncq.' || TG_TABLE_SCHEMA;
BEGIN
    IF octet_length(channel) > 63 THEN
        channel := 'asyncq.' || md5(TG_TABLE_SCHEMA);
    END IF;
    IF NEW.run_at <= now() THEN
        PERFORM pg_notify(channel, NEW.queue);
    ELSE
        PERFORM pg_notify(channel,
                          NEW.queue || chr(31) || ceil(extract(epoch FROM NEW.run_at - now()) * 1000)::bigint);
    END IF;
    RETURN NULL;
END
$$;
