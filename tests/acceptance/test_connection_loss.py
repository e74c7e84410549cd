"""A worker outlives its database connections being killed under it."""

from __future__ import annotations

from tests.harness.app import NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until

TERMINATE = """
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
  FROM pg_stat_activity
 WHERE application_name LIKE 'asyncq:%' AND pid <> pg_backend_pid()
   AND datname = current_database()
"""

CONNECTED = """
SELECT count(*) FROM pg_stat_activity
 WHERE application_name LIKE 'asyncq:%' AND datname = current_database()
"""


def test_worker_survives_its_connections_being_terminated(
    db, workers: Workers, ledger: Ledger
) -> None:
    # A poll interval longer than the test: jobs deferred once the listener is back can
    # only be picked up through its notifications.
    worker = workers.start("--poll-interval", "60", lease=2)

    def reconnects() -> int:
        return worker.stderr().count("listener reconnected")

    def all_done(ids: list[int]) -> bool:
        (left,) = db.execute(
            "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status <> 'done'", (ids,)
        ).fetchone()
        return left == 0

    for round_ in range(2):
        # The pool's, the control pool's and the LISTEN connection.
        wait_until(lambda: db.execute(CONNECTED).fetchone()[0] >= 3, 10, "three connections")
        (terminated,) = db.execute(TERMINATE).fetchone()
        assert terminated >= 3, terminated
        while_down = insert_jobs(db, NOOP, [{"n": n} for n in range(5)])
        wait_until(lambda r=round_: reconnects() > r, 10, "the listener to reconnect")
        after = insert_jobs(db, NOOP, [{"n": n} for n in range(5)])

        ids = while_down + after
        wait_until(lambda ids=ids: all_done(ids), 10, f"the jobs of round {round_}")
        assert worker.alive, worker.stderr()
        ran = sorted(e.job_id for e in ledger.events("start") if e.job_id in ids)
        assert ran == ids
