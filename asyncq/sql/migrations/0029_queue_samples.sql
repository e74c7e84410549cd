-- Each queue minute by minute, written by the workers' maintenance (one worker at a time)
-- so that the dashboard's trends outlive the jobs the pruner deletes: per clock minute,
-- the ready (due, not claimed) and running jobs when last sampled in that minute (NULL:
-- not sampled while it lasted), the jobs done and failed in it and those claimed in it
-- with the sum and the longest of their waits (seconds from due to start). A sample
-- never counts fewer than it once did: a job counted stays counted once deleted, or
-- claimed again. ``sampled_at`` a minute or more after ``minute``: the minute was
-- counted after it ended, and is whole. Kept for the worker's samples retention.
--
-- Safe beside workers and dashboards of the previous version: a new table, which they
-- never read.
CREATE TABLE asyncq_queue_samples (
    queue      text        NOT NULL,
    minute     timestamptz NOT NULL,
    depth      integer,
    running    integer,
    done       integer     NOT NULL DEFAULT 0,
    failed     integer     NOT NULL DEFAULT 0,
    started    integer     NOT NULL DEFAULT 0,
    wait_sum   float8      NOT NULL DEFAULT 0,
    wait_max   float8,
    sampled_at timestamptz NOT NULL,
    PRIMARY KEY (queue, minute)
);

CREATE INDEX asyncq_queue_samples_minute ON asyncq_queue_samples (minute);
