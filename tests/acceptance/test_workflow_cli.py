"""Work that spans jobs, as the asyncq command shows and steers it, with real worker
processes (`tests.harness.workflow_app`): ``asyncq job`` (text and JSON) shows a job's
steps, parent, children, dependencies and what it waits for; ``jobs --status waiting``,
``queues``, ``stats`` and the queue depth metric count waiting jobs; ``asyncq retry``
runs an ended job again, from a step, and refuses clearly what it cannot do."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from asyncq.admin import SHOWN
from tests.acceptance.test_metrics import free_port, scrape
from tests.harness.jobs import insert_jobs
from tests.harness.ledger import Ledger
from tests.harness.processes import Workers
from tests.harness.waiting import wait_until
from tests.harness.workflow_app import APP, emit, released, shipped


def job_json(workers: Workers, job_id: int) -> dict[str, Any]:
    run = workers.cli("job", APP, str(job_id), "--json")
    assert run.returncode == 0, run.stderr
    found: dict[str, Any] = json.loads(run.stdout)
    return found


def job_text(workers: Workers, job_id: int) -> str:
    run = workers.cli("job", APP, str(job_id))
    assert run.returncode == 0, run.stderr
    return run.stdout


def line_of(text: str, field: str) -> str:
    """The line of ``field`` in `asyncq job`'s text (its name right-aligned, then two
    spaces)."""
    [line] = [line for line in text.splitlines() if line.strip().startswith(field + "  ")]
    return line.strip()


def waiting_for(db: Any, job_id: int) -> str | None:
    """What a waiting job waits for (None: it does not wait)."""
    row = db.execute(
        "SELECT waiting_for FROM asyncq_jobs WHERE id = %s AND status = 'waiting'", (job_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def status_of(db: Any, job_id: int) -> str:
    # Not the harness's: it reads every column, and a waiting job's run_at may be
    # 'infinity', which Python's datetime cannot hold.
    row = db.execute("SELECT status::text FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def claims_of(db: Any, job_id: int) -> int:
    row = db.execute("SELECT claims FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])


def ids_of(db: Any, where: str, *params: Any) -> list[int]:
    query = f"SELECT id FROM asyncq_jobs WHERE {where} ORDER BY id"
    return [row[0] for row in db.execute(query, params)]


def steps_of(found: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["name"], s["status"]) for s in found["steps"]]


def test_job_shows_steps_children_dependencies_and_what_each_job_waits_for(
    db: Any, dsn: str, workers: Workers
) -> None:
    [order] = insert_jobs(db, "flow.order", [{"order": 1, "items": SHOWN + 1}])
    [nap] = insert_jobs(db, "flow.nap", [{"seconds": 3600}])
    [batch] = insert_jobs(db, "flow.batch", [{"order": 2, "parts": 2}])
    port = free_port()
    workers.start("--metrics-port", str(port), app=APP)
    wait_until(lambda: waiting_for(db, order) == "jobs", what="the order to gather")
    wait_until(lambda: waiting_for(db, nap) == "sleep", what="the nap to sleep")
    wait_until(lambda: status_of(db, batch) == "done", what="the batch to defer its parts")
    [(callback,)] = db.execute("SELECT result FROM asyncq_jobs WHERE id = %s", (batch,))
    children = ids_of(db, "parent_id = %s", order)
    parts = ids_of(db, "task_name = 'flow.item' AND args->>'order' = %s", "2")
    assert len(children) == SHOWN + 1 and len(parts) == 2
    waiting = {order, nap, callback, *children, *parts}
    wait_until(
        lambda: all(status_of(db, i) == "waiting" for i in waiting), what="every job to wait"
    )

    # The order gathers its children: the ones it still waits for, capped, and the total.
    found = job_json(workers, order)
    assert found["status"] == "waiting" and found["run_at"] is None
    assert found["waiting_for"] == {
        "kind": "jobs",
        "until": None,
        "key": None,
        "ids": children[:SHOWN],
        "remaining": SHOWN + 1,
    }
    assert steps_of(found) == [("charge", "done"), ("asyncq.spawn:flow.item", "done")]
    assert found["steps_total"] == 2 and found["step_names"] == ["charge", "asyncq.spawn:flow.item"]
    charge = found["steps"][0]
    assert (charge["seq"], charge["attempt"], charge["result_bytes"]) == (1, 1, len('{"order": 1}'))
    assert charge["duration_seconds"] >= 0 and charge["started_at"] <= charge["finished_at"]
    assert found["children"]["total"] == SHOWN + 1
    assert found["children"]["by_status"] == {"waiting": SHOWN + 1}
    assert [c["id"] for c in found["children"]["jobs"]] == children[:SHOWN]
    assert found["children"]["jobs"][0] == {
        "id": children[0],
        "task": "flow.item",
        "status": "waiting",
    }
    assert found["parent"] is None and found["after"] is None
    text = job_text(workers, order)
    assert line_of(text, "waiting_for").startswith(
        f"waiting_for  {SHOWN + 1} jobs to end: {children[0]} {children[1]} "
    )
    assert line_of(text, "waiting_for").endswith(f"{children[SHOWN - 1]} ...")
    assert line_of(text, "children") == (
        f"children  {SHOWN + 1} ({SHOWN + 1} waiting), {SHOWN} of {SHOWN + 1} shown"
    )
    assert line_of(text, "steps") == "steps  2"
    [charge_line] = [line for line in text.splitlines() if line.strip().startswith("charge ")]
    assert charge_line.split()[1:4] == ["1", "done", "1"] and charge_line.endswith("12 B")

    # A child: its parent, and the event it waits for (no timeout).
    child = job_json(workers, children[0])
    assert child["parent"] == order
    assert child["waiting_for"] == {
        "kind": "event",
        "until": None,
        "key": released(1),
        "ids": [],
        "remaining": 0,
    }
    child_text = job_text(workers, children[0])
    assert line_of(child_text, "parent") == f"parent  {order}"
    assert line_of(child_text, "waiting_for") == f'waiting_for  event "{released(1)}", no timeout'

    # The nap sleeps for an hour: until when, in its sleep step.
    slept = job_json(workers, nap)
    assert slept["waiting_for"]["kind"] == "sleep"
    until = datetime.fromisoformat(slept["waiting_for"]["until"])
    assert until > datetime.now(UTC) + timedelta(minutes=30)
    assert slept["run_at"] == slept["waiting_for"]["until"]
    assert steps_of(slept) == [("asyncq.sleep", "waiting")]
    assert line_of(job_text(workers, nap), "waiting_for").startswith("waiting_for  sleep, until 2")

    # The callback runs after the batch's parts, whatever they end as.
    after = job_json(workers, callback)
    assert after["after"] == {"ids": parts, "on_parent_failure": "run"}
    assert after["waiting_for"]["kind"] == "after" and after["waiting_for"]["ids"] == parts
    after_text = job_text(workers, callback)
    assert line_of(after_text, "after") == f"after  {parts[0]} {parts[1]} (on_parent_failure: run)"
    assert line_of(after_text, "waiting_for") == (
        f"waiting_for  2 jobs it runs after to end: {parts[0]} {parts[1]}"
    )

    # Listed and counted as waiting.
    listing = workers.cli("jobs", APP, "--status", "waiting", "-n", "1000", "--json")
    assert listing.returncode == 0, listing.stderr
    listed = {j["id"]: j for j in map(json.loads, listing.stdout.splitlines())}
    assert set(listed) == waiting
    assert listed[nap]["waiting_for"] == "sleep" and listed[order]["waiting_for"] == "jobs"
    assert listed[callback]["waiting_for"] == "after" and listed[order]["run_at"] is None
    assert next(iter(listed)) == nap  # the one due at a time first
    table = workers.cli("jobs", APP, "--status", "waiting").stdout.splitlines()
    assert table[0].split() == [
        "id",
        "task",
        "queue",
        "status",
        "attempts",
        "run_at",
        "waiting_for",
        "error",
    ]
    everything = workers.cli("jobs", APP, "-n", "1000", "--json")
    assert everything.returncode == 0, everything.stderr  # run_at 'infinity' is listed as none
    queues = workers.cli("queues", APP, "--json")
    [default] = [q for q in map(json.loads, queues.stdout.splitlines()) if q["name"] == "default"]
    assert default["waiting"] == len(waiting) and default["failed"] == 0
    assert "waiting" in workers.cli("queues", APP).stdout.splitlines()[0].split()
    stats = json.loads(workers.cli("stats", APP, "--json").stdout)
    assert stats["rows"]["waiting"] == len(waiting)
    assert f"waiting {len(waiting)}," in workers.cli("stats", APP).stdout

    def depth() -> dict[str, float]:
        found = scrape(port)
        states = {
            dict(labels)["state"]: value
            for (name, labels), value in found.items()
            if name == "asyncq_queue_jobs" and dict(labels)["queue"] == "default"
        }
        return states if states.get("waiting") == len(waiting) else {}

    assert wait_until(depth, what="the queue depth metric to count the waiting jobs")["failed"] == 0

    # Released, the children end; the order goes on, then waits for an event with a timeout.
    assert emit(dsn, released(1))
    wait_until(
        lambda: waiting_for(db, order) == f"event:{shipped(1)}", what="the order to wait again"
    )
    found = job_json(workers, order)
    assert found["waiting_for"]["key"] == shipped(1)
    assert datetime.fromisoformat(found["waiting_for"]["until"]) > datetime.now(UTC) + timedelta(
        minutes=30
    )
    assert steps_of(found) == [
        ("charge", "done"),
        ("asyncq.spawn:flow.item", "done"),
        ("pack", "done"),
        (f"asyncq.wait:{shipped(1)}", "waiting"),
    ]
    assert found["children"]["by_status"] == {"done": SHOWN + 1}
    assert line_of(job_text(workers, order), "waiting_for").startswith(
        f'waiting_for  event "{shipped(1)}", until 2'
    )
    assert emit(dsn, shipped(1), {"carrier": "post"})
    wait_until(lambda: status_of(db, order) == "done", what="the order to end")
    found = job_json(workers, order)
    assert found["waiting_for"] is None
    assert [s for _, s in steps_of(found)] == ["done"] * 5
    assert "waiting_for" not in job_text(workers, order)


def test_retry_runs_an_ended_job_again_from_a_step_and_refuses_what_it_cannot(
    db: Any, dsn: str, workers: Workers, ledger: Ledger
) -> None:
    [order] = insert_jobs(db, "flow.order", [{"order": 3, "items": 2}])
    [nap] = insert_jobs(db, "flow.nap", [{"seconds": 3600}])
    workers.start(app=APP)
    wait_until(lambda: waiting_for(db, order) == "jobs", what="the order to gather")
    assert emit(dsn, released(3)) and emit(dsn, shipped(3), "sent")
    wait_until(lambda: status_of(db, order) == "done", what="the order to end")
    wait_until(lambda: waiting_for(db, nap) == "sleep", what="the nap to sleep")

    def ran(step: str) -> int:
        return len(ledger.events(step, order))

    assert (ran("charge"), ran("pack"), ran("notify")) == (1, 1, 1)
    claims = claims_of(db, order)

    again = workers.cli("retry", APP, str(order), "--from-step", "pack")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == (
        f"job {order} (done) queued again from step 'pack': 3 recorded steps forgotten,"
        " to run again"
    )
    wait_until(
        lambda: status_of(db, order) == "done" and claims_of(db, order) > claims,
        what="the order to end again",
    )
    # The steps before 'pack' kept their results; 'pack' and every later one ran again.
    assert (ran("charge"), ran("pack"), ran("notify")) == (1, 2, 2)
    assert db.execute(
        "SELECT count(*) FROM asyncq_jobs WHERE parent_id = %s", (order,)
    ).fetchone() == (2,)

    claims = claims_of(db, order)
    whole = workers.cli("retry", APP, str(order))
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout.strip() == (
        f"job {order} (done) queued again; its finished steps keep their results"
    )
    wait_until(
        lambda: status_of(db, order) == "done" and claims_of(db, order) > claims,
        what="the order to end once more",
    )
    assert (ran("charge"), ran("pack"), ran("notify")) == (1, 2, 2)

    for args, error in (
        ([str(10**9)], f"no job has the id {10**9} (it never existed, or was pruned)"),
        ([str(nap)], f"job {nap} is waiting: only a job that ended can run again"),
        ([str(order), "--from-step", "nope"], f"job {order} has no step named 'nope'"),
    ):
        refused = workers.cli("retry", APP, *args)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert refused.stdout == ""
        errors = [line for line in refused.stderr.splitlines() if "error" in line]
        assert errors == [f"asyncq: error: {error}"], refused.stderr
    assert status_of(db, order) == "done" and status_of(db, nap) == "waiting"
