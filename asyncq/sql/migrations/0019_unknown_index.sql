-- asyncq: no transaction
-- Jobs given back by a worker that did not know their task, by when that first happened:
-- what the maintenance reads to fail those no worker took within the grace. Only they
-- enter it. Built CONCURRENTLY: workers go on writing.
CREATE INDEX CONCURRENTLY IF NOT EXISTS asyncq_jobs_unknown ON asyncq_jobs (unknown_since)
    WHERE unknown_since IS NOT NULL;
