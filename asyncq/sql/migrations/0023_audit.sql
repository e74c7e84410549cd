-- The record of what people did to many jobs at once (the dashboard's bulk actions):
-- who (the identity the dashboard's authorize hook gave, else "local"), what (the action
-- and its value: a priority, a queue), the filter that chose the jobs, how many matched
-- the preview and how many rows changed, and when. Kept until someone deletes it: a few
-- rows a day.
--
-- Safe beside workers of the previous version: a new table, which they never read.
CREATE TABLE asyncq_audit (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    action  text        NOT NULL,
    filter  jsonb       NOT NULL,
    detail  jsonb,
    rows    bigint      NOT NULL,
    matched bigint      NOT NULL
);
