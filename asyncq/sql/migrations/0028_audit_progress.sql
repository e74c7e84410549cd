-- A bulk action's audit record is written when it starts and kept up to date as it runs:
-- ``rows`` changed so far (each batch writes its count in the batch's own transaction),
-- ``state`` running, done, failed (with its ``error``) or stopped (its process shut down
-- before its end), and ``updated_at``, which the running action moves every few seconds.
-- A record left running whose updated_at stands still is an action that did not finish:
-- its process died. Records written before, and those an older dashboard writes once its
-- action has ended, are done.
--
-- Safe beside workers and dashboards of the previous version: new columns with defaults,
-- which they never read, and an insert of theirs fills as it did.
ALTER TABLE asyncq_audit
    ADD COLUMN state      text        NOT NULL DEFAULT 'done'
        CHECK (state IN ('running', 'done', 'failed', 'stopped')),
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN error      text;
