-- The state of rate limits, and the announcement of finished jobs to the Apps that wait
-- for results.
--
-- Safe where they exist already (IF NOT EXISTS, OR REPLACE). A new table and a new
-- function: nothing the workers of the previous versions use changes.

-- Rate limits: the starts of each rate-limited task, one row per claim that started some
-- of its jobs, at that claim's time. Claims of limited tasks are serialised (an advisory
-- lock), so each one sees every earlier start: a claim counts the starts of the last
-- period before its own time and starts at most what the limit leaves. Rows older than
-- the period are deleted by the claims themselves.
CREATE TABLE IF NOT EXISTS asyncq_rate_starts (
    task_name  text        NOT NULL,
    started_at timestamptz NOT NULL,
    count      int         NOT NULL CHECK (count > 0),
    PRIMARY KEY (task_name, started_at)
);

-- Results: news of finished jobs. Every statement that ends jobs (done, failed or
-- cancelled) sends their ids on asyncq_results_channel() through this function, once per
-- statement: comma-separated, in chunks of 300 ids (at most 21 bytes an id with its
-- comma), so that each payload stays below the 8000 bytes PostgreSQL allows. No ids (an
-- empty array or NULL): nothing is sent.
CREATE OR REPLACE FUNCTION asyncq_notify_ids(channel text, ids bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT count(pg_notify(channel, array_to_string(ids[i:i + 299], ',')))
      FROM generate_series(1, cardinality(ids), 300) AS i
$$;
