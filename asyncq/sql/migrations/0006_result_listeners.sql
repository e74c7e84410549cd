-- The Apps that wait for results, so that the statements that end jobs announce them only
-- while one does: a NOTIFY costs every commit that sends one (the server serialises
-- them on one queue), and most fleets never wait for a result.
--
-- An App's results listener writes its row once it LISTENs, renews seen_at every few
-- seconds, and deletes it when it stops; a row not renewed for a minute (its App died)
-- counts no more. An App looks up every waited job after it starts listening, so a job
-- that ended before its row was seen is found all the same.
CREATE TABLE asyncq_result_listeners (
    listener text        PRIMARY KEY,
    seen_at  timestamptz NOT NULL DEFAULT now()
);

-- The table is named with its schema in the function (fixed here, as the channel is), so
-- that it is found whatever the search path of the statement that calls it.
DO $migration$
BEGIN
    EXECUTE format($sql$
        CREATE OR REPLACE FUNCTION asyncq_notify_ids(channel text, ids bigint[]) RETURNS bigint
        LANGUAGE sql VOLATILE AS $$
            SELECT count(pg_notify(channel, array_to_string(ids[i:i + 299], ',')))
              FROM generate_series(1, cardinality(ids), 300) AS i
             WHERE EXISTS (SELECT FROM %I.asyncq_result_listeners
                            WHERE seen_at > now() - interval '1 minute')
        $$
    $sql$, current_schema());
END
$migration$;
