"""The asyncq command's views and upkeep: jobs, job, queues, stats (with the vacuum
warning, made real by a long-open transaction while jobs churn) and prune, each as a
table and as JSON; a listing cut short says how many it holds; the fields of `jobs` and
`job` are named alike; bad arguments give one-line errors; no log line unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tests.harness.app import APP, FAIL, NOOP
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import REPO, Workers
from tests.harness.waiting import wait_until

SERVER_AUTOVACUUM_OFF = "autovacuum is off on this server"


def warnings_of(stderr: str) -> list[str]:
    """The warning lines, less the one of a test server that runs without autovacuum."""
    return [
        line
        for line in stderr.splitlines()
        if line.startswith("WARNING") and SERVER_AUTOVACUUM_OFF not in line
    ]


def settled(db: Any, ids: list[int]) -> bool:
    rows = db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE id = ANY(%s) AND status IN ('done', 'failed')",
        (ids,),
    ).fetchone()
    return bool(rows and rows[0] == len(ids))


def test_jobs_job_and_queues_show_what_the_table_holds(db, workers: Workers) -> None:
    done = insert_jobs(db, NOOP, [{"n": n} for n in range(3)])
    failed = insert_jobs(db, FAIL, [{"tag": 1}], queue="risky")
    evil = "<script>alert(1)</script>\x1b[31m"
    insert_jobs(db, NOOP, [{"n": 9}], queue=evil, run_at=datetime.now(UTC) + timedelta(hours=1))
    worker = workers.start()
    wait_until(lambda: settled(db, done + failed), 15, "the jobs to end")
    worker.send(15)
    worker.wait(15)

    listing = workers.cli("jobs", APP, "--status", "failed")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "task", "queue", "status"]
    assert len(lines) == 2 and f"{failed[0]} " in lines[1] and "RuntimeError" in lines[1]

    pages = [workers.cli("jobs", APP, "--status", "done", "-n", "2", "--json")]
    last = json.loads(pages[0].stdout.splitlines()[-1])["id"]
    pages.append(workers.cli("jobs", APP, "-s", "done", "-n", "2", "--before", str(last), "--json"))
    paged = [json.loads(line)["id"] for page in pages for line in page.stdout.splitlines()]
    assert sorted(paged) == done
    refused = workers.cli("jobs", APP, "--status", "queued", "--before", "1")
    assert refused.returncode == 2 and "before_id" in refused.stderr

    as_json = workers.cli("jobs", APP, "--queue", "risky", "--json")
    [row] = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert (row["id"], row["status"], row["queue"]) == (failed[0], "failed", "risky")

    # A hostile queue name reaches the terminal escaped.
    listing = workers.cli("jobs", APP, "--status", "queued")
    assert "\x1b" not in listing.stdout and "\\x1b[31m" in listing.stdout

    one = workers.cli("job", APP, str(failed[0]), "--json")
    detail = json.loads(one.stdout)
    assert detail["args"] == {"tag": 1} and detail["attempts_used"] == detail["max_attempts"]
    retries = ["retried"] * (detail["max_attempts"] - 1)
    assert [a["outcome"] for a in detail["attempts"]] == [*retries, "failed"]
    assert "job 1 fails on purpose" in detail["last_error"]
    text = workers.cli("job", APP, str(failed[0])).stdout
    assert "Traceback (most recent call last)" in text

    missing = workers.cli("job", APP, "999999")
    assert missing.returncode == 1 and "not found" in missing.stderr

    queues = workers.cli("queues", APP, "--json")
    by_name = {q["name"]: q for q in map(json.loads, queues.stdout.splitlines())}
    assert by_name["default"]["done_last_hour"] == 3
    assert by_name["risky"]["failed"] == 1
    assert by_name[evil]["scheduled"] == 1 and by_name[evil]["ready"] == 0
    table = workers.cli("queues", APP).stdout
    assert table.splitlines()[0].split()[:3] == ["queue", "ready", "scheduled"]


def test_bad_arguments_are_one_line_errors(workers: Workers) -> None:
    for args in (
        ["jobs", APP, "--status", "stuck"],
        ["jobs", APP, "--limit", "0"],
        ["jobs", APP, "--queue", ""],
        ["prune", APP, "--older-than", "soon"],
        ["stats", APP, "--max-snapshot-age", "-1"],
    ):
        run = workers.cli(*args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        errors = [line for line in run.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and errors[0].startswith("asyncq"), run.stderr
        assert "Traceback" not in run.stderr


def test_stats_warns_while_an_old_snapshot_holds_vacuum_back(
    db, dsn: str, workers: Workers, ledger: Ledger
) -> None:
    quiet = workers.cli("stats", APP, "--json")
    assert quiet.returncode == 0, quiet.stderr
    assert not warnings_of(quiet.stderr)

    # A session that took a snapshot and stays in its transaction, while jobs churn.
    with psycopg.connect(dsn) as holder:
        holder.execute("SET application_name = 'forgotten report'")
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM asyncq_jobs").fetchone()
        worker = workers.start("--concurrency", "20")
        ids = insert_jobs(db, NOOP, [{"n": n} for n in range(2000)])
        wait_until(lambda: settled(db, ids), 60, "the churn to end")
        db.execute("VACUUM asyncq_jobs")  # it runs, and can remove nothing newer than the snapshot
        time.sleep(1.1)
        held = workers.cli("stats", APP, "--max-snapshot-age", "1s")
        assert held.returncode == 0, held.stderr
        warning = [line for line in warnings_of(held.stderr) if "vacuum is held back" in line]
        assert warning, held.stdout + held.stderr
        assert "forgotten report" in warning[0] and "idle in transaction" in warning[0]
        text = held.stdout
        assert "oldest snapshot: session pid" in text and "forgotten report" in text
        dead = json.loads(workers.cli("stats", APP, "--json").stdout)["dead_tuples"]
        assert dead >= 2000, dead  # each job left dead versions that the vacuum had to keep
        holder.rollback()
    worker.send(15)
    worker.wait(15)
    db.execute("VACUUM asyncq_jobs")
    after = workers.cli("stats", APP, "--max-snapshot-age", "1s", "--json")
    assert "vacuum is held back" not in after.stderr
    assert json.loads(after.stdout)["dead_tuples"] < dead


def test_stats_warns_when_autovacuum_is_off_for_the_table_however_recent_the_vacuum(
    db, workers: Workers
) -> None:
    """Autovacuum turned off on the jobs table, and ten dead row versions per live row
    left by a delete right after a manual VACUUM: both are warned of."""
    db.execute("ALTER TABLE asyncq_jobs SET (autovacuum_enabled = off)")
    try:
        db.execute(
            "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
            " SELECT 'old', 'done', now() FROM generate_series(1, 11000)"
        )

        def reported(live: int, dead: int) -> Callable[[], bool]:
            # The statistics of a statement arrive a moment after it ends.
            return lambda: (
                db.execute(
                    "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables"
                    " WHERE relid = 'asyncq_jobs'::regclass"
                ).fetchone()
                == (live, dead)
            )

        wait_until(reported(11000, 0), 15, "the statistics to count the insert")
        db.execute("VACUUM asyncq_jobs")
        db.execute("DELETE FROM asyncq_jobs WHERE id > 1000")
        wait_until(reported(1000, 10000), 15, "the statistics to count the delete")
        run = workers.cli("stats", APP)
        assert run.returncode == 0, run.stderr
        assert "(10.00 dead per live)" in run.stdout
        warnings = warnings_of(run.stderr)
        assert len(warnings) == 2, run.stderr
        assert warnings[0].startswith("WARNING: vacuum is falling behind: 10000 dead row")
        assert "(10.00 per live row)" in warnings[0]
        assert warnings[1].startswith("WARNING: autovacuum is off for asyncq_jobs")
        assert "RESET (autovacuum_enabled)" in warnings[1]
        found = json.loads(workers.cli("stats", APP, "--json").stdout)
        assert found["autovacuum_off"] == ["asyncq_jobs"]
    finally:
        db.execute("ALTER TABLE asyncq_jobs RESET (autovacuum_enabled)")
    db.execute("VACUUM asyncq_jobs")
    run = workers.cli("stats", APP)
    assert not warnings_of(run.stderr), run.stderr


def test_prune_deletes_old_done_jobs_in_batches_and_keeps_the_rest(db, workers: Workers) -> None:
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " SELECT 'old', 'done', now() - interval '3 days' FROM generate_series(1, 25000)"
    )
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at) VALUES"
        " ('recent', 'done', now() - interval '1 hour'),"
        " ('kept', 'failed', now() - interval '30 days')"
    )
    run = workers.cli("prune", APP, "--older-than", "2d", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["pruned"] == 25000
    left = db.execute("SELECT task_name FROM asyncq_jobs ORDER BY task_name").fetchall()
    assert [r[0] for r in left] == ["kept", "recent"]
    again = workers.cli("prune", APP, "--older-than", "30m")
    assert again.stdout.strip() == "pruned 1 done jobs that finished more than 30m 0s ago"


def test_a_listing_cut_short_says_how_many_jobs_it_holds(db, workers: Workers) -> None:
    insert_jobs(
        db, FAIL, [{"n": n} for n in range(5)], status="failed", finished_at=datetime.now(UTC)
    )
    insert_jobs(db, NOOP, [{"n": n} for n in range(3)])

    cut = workers.cli("jobs", APP, "--status", "failed", "-n", "3")
    assert cut.returncode == 0, cut.stderr
    lines = cut.stdout.splitlines()
    assert len(lines) == 1 + 3 + 1, cut.stdout
    third = int(lines[3].split()[0])
    assert lines[-1] == f"3 of 5 shown; the next page: --before {third}"
    rest = workers.cli("jobs", APP, "--status", "failed", "-n", "3", "--before", str(third))
    assert len(rest.stdout.splitlines()) == 1 + 2  # the last page: nothing more to say
    whole = workers.cli("jobs", APP, "--status", "failed", "-n", "5")
    assert len(whole.stdout.splitlines()) == 1 + 5  # exactly a page: not cut
    as_json = workers.cli("jobs", APP, "--status", "failed", "-n", "3", "--json")
    assert [json.loads(line)["status"] for line in as_json.stdout.splitlines()] == ["failed"] * 3

    backlog = workers.cli("jobs", APP, "--status", "queued", "-n", "2")
    assert backlog.stdout.splitlines()[-1] == "2 of 3 shown; more with --limit N"

    # Beyond a thousand, counting stops: the count costs what listing a thousand would.
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " SELECT 'old', 'done', now() FROM generate_series(1, 1200)"
    )
    many = workers.cli("jobs", APP, "-n", "2")
    newest = int(many.stdout.splitlines()[2].split()[0])
    assert many.stdout.splitlines()[-1] == f"2 of 1,000+ shown; the next page: --before {newest}"


def test_jobs_and_job_name_their_fields_alike_and_take_the_id_first_too(
    db, workers: Workers
) -> None:
    [failed] = insert_jobs(
        db,
        FAIL,
        [{"tag": 1}],
        status="failed",
        attempts=3,
        finished_at=datetime.now(UTC),
        last_error="RuntimeError: no\nTraceback (most recent call last):\n  ...",
    )
    [listed] = map(json.loads, workers.cli("jobs", APP, "--json").stdout.splitlines())
    detail = json.loads(workers.cli("job", APP, str(failed), "--json").stdout)
    assert {name: detail[name] for name in listed if name in detail} == listed
    assert listed["last_error"].startswith("RuntimeError: no\nTraceback")
    table = workers.cli("jobs", APP).stdout  # the table shows the error's first line
    assert table.splitlines()[1].endswith("RuntimeError: no")

    id_first = workers.cli("job", str(failed), APP, "--json")
    assert id_first.returncode == 0, id_first.stderr
    assert json.loads(id_first.stdout) == detail


def test_the_commands_that_print_what_they_found_log_nothing_unless_asked(
    db, workers: Workers
) -> None:
    insert_jobs(db, NOOP, [{"n": 1}])
    for command in ("jobs", "queues", "schedules", "stats"):
        quiet = workers.cli(command, APP)
        assert quiet.returncode == 0, quiet.stderr
        assert "using PostgreSQL" not in quiet.stderr, (command, quiet.stderr)
        assert " INFO " not in quiet.stderr, (command, quiet.stderr)
    asked = workers.cli("jobs", APP, "--log-level", "INFO")
    assert "INFO    asyncq.app: using PostgreSQL at" in asked.stderr, asked.stderr
    migrated = workers.cli("migrate", APP)  # a command that changes things says what it uses
    assert "using PostgreSQL at" in migrated.stderr, migrated.stderr


def test_a_listing_read_by_a_reader_that_stops_early_ends_without_a_traceback(
    db, workers: Workers
) -> None:
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " SELECT 'old', 'done', now() FROM generate_series(1, 2000)"
    )
    # `asyncq jobs --json -n 2000 | head -1`: far more than a pipe holds.
    with subprocess.Popen(
        [sys.executable, "-m", "asyncq", "jobs", APP, "--json", "-n", "2000"],
        env=workers.env(),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as listing:
        assert listing.stdout is not None and listing.stderr is not None
        assert json.loads(listing.stdout.readline())["task_name"] == "old"
        listing.stdout.close()
        stderr = listing.stderr.read().decode()
        assert listing.wait(30) == 141, stderr  # as a shell reports a tool that SIGPIPE ended
    assert stderr == ""
