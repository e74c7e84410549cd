-- A job's state for work that spans jobs: `waiting`, suspended by its own task (a durable
-- sleep, an event, children to gather) or deferred after other jobs (options(after=...)),
-- until what it waits for comes. Outside every ready index: waiting jobs cost the claim
-- nothing. A value of its own migration: a value added to an enum cannot be used in the
-- transaction that adds it.
ALTER TYPE asyncq_job_status ADD VALUE IF NOT EXISTS 'waiting' AFTER 'running';
