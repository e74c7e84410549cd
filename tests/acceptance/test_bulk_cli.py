"""asyncq bulk and asyncq audit against a real database, as processes: without --yes a
bulk action prints its preview and changes nothing; with it, it changes the jobs that
match (only those), prints the rows done as each batch commits, and writes an audit
record under the OS user, which asyncq audit lists."""

from __future__ import annotations

import getpass
import json
from typing import Any

from tests.harness.app import APP, NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.processes import Workers


def states(db: Any, ids: list[int]) -> dict[int, tuple[str, str, int]]:
    rows = db.execute(
        "SELECT id, status::text, queue, priority FROM asyncq_jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_a_preview_changes_nothing_and_yes_changes_the_matching_rows_with_an_audit(
    db: Any, workers: Workers
) -> None:
    failed = insert_jobs(db, NOOP, [{"n": n} for n in range(5)], queue="mail", status="failed")
    other = insert_jobs(db, NOOP, [{"n": 9}], queue="reports", status="failed")
    queued = insert_jobs(db, NOOP, [{"n": 7}], queue="mail")
    everything = failed + other + queued
    before = states(db, everything)

    preview = workers.cli("bulk", APP, "requeue", "--queue", "mail")
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.splitlines() == [
        "6 jobs match; 5 of them (failed, cancelled) would be put back in the queue,"
        " attempts reset.",
        "nothing changed: run it with --yes to requeue them",
    ]
    assert states(db, everything) == before
    assert db.execute("SELECT count(*) FROM asyncq_audit").fetchone() == (0,)
    as_json = workers.cli("bulk", APP, "requeue", "--queue", "mail", "--json")
    assert json.loads(as_json.stdout) == {
        "action": "requeue",
        "preview": True,
        "matched": 6,
        "changes": 5,
        "more": False,
    }

    done = workers.cli("bulk", APP, "requeue", "--queue", "mail", "--yes", "--batch", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "requeue: 5 of 6 matching jobs changed in 3 batches; audit record 1"
    )
    # The rows done as each batch of two committed.
    assert done.stderr.splitlines() == [
        "requeue: 2 of 5 jobs done",
        "requeue: 4 of 5 jobs done",
        "requeue: 5 of 5 jobs done",
    ]
    after = states(db, everything)
    assert all(after[i][0] == "queued" for i in failed)
    assert after[other[0]] == before[other[0]]  # another queue: left alone
    assert after[queued[0]] == before[queued[0]]
    [record] = db.execute("SELECT actor, action, rows, matched, state FROM asyncq_audit").fetchall()
    assert record == (getpass.getuser(), "requeue", 5, 6, "done")

    moved = workers.cli("bulk", APP, "move", "urgent", "-q", "mail", "-s", "queued", "--yes")
    assert moved.returncode == 0, moved.stderr
    assert {after[0:2] for after in states(db, failed + queued).values()} == {("queued", "urgent")}
    raised = workers.cli("bulk", APP, "priority", "5", "-q", "urgent", "--yes", "--json")
    assert json.loads(raised.stdout)["changed"] == 6
    assert {p for _, _, p in states(db, failed + queued).values()} == {5}

    listed = workers.cli("audit", APP)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["id", "at", "actor", "action", "filter", "matched", "rows", "state"]
    assert len(lines) == 4
    assert "priority 5" in lines[1] and "queue=urgent" in lines[1]
    assert "move urgent" in lines[2] and "status=queued" in lines[2]
    assert all(line.endswith(" done") for line in lines[1:])
    records = [json.loads(line) for line in workers.cli("audit", APP, "--json").stdout.splitlines()]
    assert [r["action"] for r in records] == ["priority", "move", "requeue"]
    assert records[0]["detail"] == {"priority": 5} and records[0]["rows"] == 6
    assert {(r["state"], r["error"]) for r in records} == {("done", None)}
    assert {r["actor"] for r in records} == {getpass.getuser()}


def test_bad_bulk_arguments_are_refused_and_change_nothing(db: Any, workers: Workers) -> None:
    empty = workers.cli("bulk", APP, "delete", "--yes")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.splitlines()[-1] == "nothing changed: there are no jobs"
    ids = insert_jobs(db, NOOP, [{"n": 1}], status="failed")
    for args, says in (
        (["priority", "high"], "priority takes the new priority"),
        (["move"], "move takes the queue"),
        (["requeue", "extra"], "requeue takes no value"),
        (["requeue", "--batch", "0"], "--batch"),
    ):
        refused = workers.cli("bulk", APP, *args, "--yes")
        assert refused.returncode == 2, (args, refused.stderr)
        assert says in refused.stderr, (args, refused.stderr)
    assert states(db, ids)[ids[0]][0] == "failed"
    assert db.execute("SELECT count(*) FROM asyncq_audit").fetchone() == (0,)
    assert workers.cli("audit", APP).stdout.strip() == "no bulk actions recorded"
