-- Limits that live in the database: an override per task or per queue of the limits a
-- task declares in code (concurrency, rate_limit, group_concurrency). A NULL column keeps
-- the limit below it: the task's override over its queue's, the queue's over the code's.
-- Written by `App.set_limits` and `asyncq limits`, which notify the schema's channel in
-- the same transaction; every worker reads the whole table then (it holds a row per
-- target, a handful), and every poll interval besides, for a notification it missed.
CREATE TABLE asyncq_limits (
    kind              text NOT NULL CHECK (kind IN ('task', 'queue')),
    name              text NOT NULL,
    concurrency       int CHECK (concurrency > 0),
    rate              int CHECK (rate > 0),
    period            float8 CHECK (period > 0),
    group_concurrency int CHECK (group_concurrency > 0),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, name),
    CHECK ((rate IS NULL) = (period IS NULL))
);
