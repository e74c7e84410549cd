"""The statements a worker repeats keep their index plans whatever the statistics of
asyncq_jobs said when a session first planned them (migration 0013).

A session keeps its plans: a function's for the session's life, a prepared statement's
generic plan too. Planned while the table was empty (a new install, a quiet night after
autovacuum), the claim was a sequential scan and a sort of every ready row, kept through
the burst that followed. Here each function's statements are planned as the function
plans them (its settings, its arguments and variables as parameters, a generic plan)
under empty, tiny and skewed statistics, and the plans are read; then a session that
first ran every function on the empty, analyzed table runs them on a burst of 100,000
jobs, and reads a small part of the table each time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from tests.harness.waiting import wait_until

# Each function of migrations 0013 with arguments to plan and run it with: the worker 'w'
# holds jobs 1 to 10 by their first claim.
IDS = "'{1,2,3,4,5,6,7,8,9,10}'::bigint[]"
CLAIMS = "'{1,1,1,1,1,1,1,1,1,1}'::bigint[]"
CALLS = {
    "asyncq_claim": [
        "'w', 10, '30 s', NULL",
        "'w', 10, '30 s', '{default}'",
        "'w', 10, '30 s', '{default,other}'",
        "'w', 10, '30 s', NULL, '{unknown.task}'",
    ],
    "asyncq_claim_limited": [
        "'w', 10, '30 s', NULL, 1000, '{limited}', '{1}', '{NULL}', '{NULL}', '{NULL}', 10",
        "'w', 10, '30 s', '{default}', 1000, '{limited}', '{1}', '{NULL}', '{NULL}', '{2}', 10",
    ],
    "asyncq_mark_done": [f"'w', {IDS}, {CLAIMS}"],
    "asyncq_mark_done_results": [f"'w', {IDS}, {CLAIMS}, array_fill('1'::text, ARRAY[10])"],
    "asyncq_mark_failed": [
        f"'w', {IDS}, {CLAIMS}, array_fill(1.0::float8, ARRAY[10]),"
        " array_fill('boom'::text, ARRAY[10]), array_fill(false, ARRAY[10])",
        # With what the attempts logged and reported (migration 0020).
        f"'w', {IDS}, {CLAIMS}, array_fill(1.0::float8, ARRAY[10]),"
        " array_fill('boom'::text, ARRAY[10]), array_fill(false, ARRAY[10]),"
        """ array_fill('{"records": [], "dropped": 0}'::text, ARRAY[10]),"""
        """ array_fill('{"count": 3}'::text, ARRAY[10])""",
    ],
    "asyncq_mark_snoozed": [f"'w', {IDS}, {CLAIMS}, array_fill(1.0::float8, ARRAY[10])"],
    "asyncq_mark_cancelled": [f"'w', {IDS}, {CLAIMS}"],
    "asyncq_release": [f"'w', {IDS}, {CLAIMS}, 3"],
    "asyncq_heartbeat": [f"'w', {IDS}, {CLAIMS}"],
    "asyncq_aborts_requested": [f"'w', {IDS}, {CLAIMS}"],
    "asyncq_written_by_claims": [
        f"'w', {IDS}, {CLAIMS}, array_fill('done'::text, ARRAY[10]),"
        " array_fill(NULL::text, ARRAY[10]), array_fill(1, ARRAY[10])"
    ],
    "asyncq_reap_expired": ["10"],
    "asyncq_prune_done": ["'1 day', 10"],
    "asyncq_job_endings": [IDS],
    "asyncq_live_job_with_key": ["'k'"],
    "asyncq_queue_overview": [""],
    "asyncq_queue_states": [""],  # migration 0017
    # Work that spans jobs (migration 0015).
    "asyncq_release_waiters": ["'{1,2}'::bigint[]"],
    "asyncq_wake_waiters": ["'{1,2}'::bigint[]"],
    "asyncq_write_steps": [
        f"'w', {IDS}, {CLAIMS}, array_fill('s'::text, ARRAY[10]), array_fill(1, ARRAY[10]),"
        " array_fill('1'::text, ARRAY[10]), array_fill(1, ARRAY[10]),"
        " array_fill(now(), ARRAY[10])"
    ],
    "asyncq_job_steps": ["1"],
    "asyncq_suspend": [
        "'w', 1, 1, 'jobs', NULL, NULL, NULL, '{2,3}'::bigint[], NULL, 0, 1",
        "'w', 1, 1, 'event', NULL, 5.0, 'k', NULL, 'asyncq.wait:k', 1, 1",
    ],
    "asyncq_emit_event": ["'k', '1'"],
    "asyncq_wake_due": ["10"],
    "asyncq_next_wake": [""],
    "asyncq_wake_lost": ["10"],
    "asyncq_spawn": ["'w', 1, 1, 1, 'asyncq.spawn:t', 1, 't', 'default', '[{}]', 0, 3"],
    "asyncq_defer_after": ["'t', 'default', '[{}]', 0, 3, '{1,2}'::bigint[], 'cancel'"],
    "asyncq_cancel": ["'{1,2}'::bigint[]"],
    "asyncq_retry": ["1, 's'"],
    "asyncq_prune_events": ["'1 day', 10"],
    # Attempts, progress and logs (migration 0020).
    "asyncq_mark_done_with": [
        f"'w', {IDS}, {CLAIMS}, array_fill(NULL::text, ARRAY[10]),"
        """ array_fill('{"records": [], "dropped": 0}'::text, ARRAY[10]),"""
        """ array_fill('{"fraction": 1.0}'::text, ARRAY[10])"""
    ],
    "asyncq_give_back": [f"'w', {IDS}, {CLAIMS}, array_fill('gone'::text, ARRAY[10]), 1.0"],
    "asyncq_fail_unknown": ["'10 minutes', 10"],
    "asyncq_write_progress": [
        f"""'w', {IDS}, {CLAIMS}, array_fill('{{"count": 3}}'::text, ARRAY[10])"""
    ],
    "asyncq_attempt_record": ["1, 'w', now(), now(), now(), 'retried', 'boom', NULL, NULL"],
    "asyncq_history_append": ["NULL, '{}'::jsonb"],
}
# The overviews: they count every job of a state but done, through that state's index.
COUNTS = ("asyncq_queue_overview", "asyncq_queue_states")
# The index `asyncq migrate` makes for an App with limits: the claim of limited tasks reads it.
READY_BY_TASK = (
    "CREATE INDEX IF NOT EXISTS asyncq_jobs_ready_by_task"
    " ON asyncq_jobs (task_name, priority DESC, run_at, id) WHERE status = 'queued'"
)


def stats_empty(db: psycopg.Connection[Any]) -> None:
    db.execute("VACUUM ANALYZE asyncq_jobs")


def stats_tiny(db: psycopg.Connection[Any]) -> None:
    db.execute("INSERT INTO asyncq_jobs (task_name) SELECT 't' FROM generate_series(1, 10)")
    db.execute("VACUUM ANALYZE asyncq_jobs")


def stats_skewed(db: psycopg.Connection[Any]) -> None:
    """A table of finished jobs, its few queued ones in a queue the claims do not ask for."""
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, status, finished_at)"
        " SELECT 't', 'done', now() - interval '2 days' FROM generate_series(1, 30000)"
    )
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, queue)"
        " SELECT 't', 'elsewhere' FROM generate_series(1, 100)"
    )
    db.execute("VACUUM ANALYZE asyncq_jobs")


def stats_all_queued(db: psycopg.Connection[Any]) -> None:
    """A small table analyzed while every job was queued: no running job in the statistics
    (a join of the done writes to their arrays was planned as a scan of the table, with
    the arrays read again for each running row)."""
    db.execute("INSERT INTO asyncq_jobs (task_name) SELECT 't' FROM generate_series(1, 3000)")
    db.execute("ANALYZE asyncq_jobs")


STATES = {
    "empty": stats_empty,
    "tiny": stats_tiny,
    "skewed": stats_skewed,
    "all queued": stats_all_queued,
}


@pytest.fixture
def ready_by_task(db: psycopg.Connection[Any]) -> Iterator[None]:
    db.execute(READY_BY_TASK)
    yield
    db.execute("DROP INDEX asyncq_jobs_ready_by_task")


# A line of PL/pgSQL that is not part of a statement: its control flow, an assignment.
CONTROL = re.compile(
    r"^\s*(IF|ELSIF|ELSE|END|LOOP|WHILE|EXIT|RETURN(?!\s+QUERY)|GET\s+DIAGNOSTICS|BEGIN"
    r"|NULL\b|v_\w+\s*:=)",
    re.I,
)
SQL_START = ("SELECT", "WITH", "UPDATE", "DELETE", "INSERT")


def statements(source: str) -> list[str]:
    """The SQL statements of a PL/pgSQL function's body, as it runs them (PERFORM as
    SELECT, without the INTO of its variables)."""
    body = re.split(r"^\s*BEGIN\s*$", source, maxsplit=1, flags=re.M)[-1]
    body = re.sub(r"--[^\n]*", "", body)
    found = []
    for piece in re.split(r";[ \t]*$", body, flags=re.M):
        lines = piece.strip().splitlines()
        while lines and CONTROL.match(lines[0]):
            lines = lines[1:]
        text = "\n".join(lines).strip()
        text = re.sub(r"^RETURN QUERY\s+", "", text)
        text = re.sub(r"^PERFORM\s+", "SELECT ", text)
        text = re.sub(r"\bINTO\s+v_\w+(\s*,\s*v_\w+)*", "", text)
        if text.upper().startswith(SQL_START):
            found.append(text)
    return found


def generic_plans(db: psycopg.Connection[Any], function: str, arguments: str) -> list[Any]:
    """The plan of each statement of ``function`` as the function plans it: its settings,
    a generic plan, its arguments and variables as parameters (the values of
    ``arguments`` for its arguments, NULL for its variables), run and rolled back (a
    statement that cannot run with those is explained without running)."""
    row = db.execute(
        "SELECT prosrc, proargnames, oidvectortypes(proargtypes), proconfig FROM pg_proc"
        " WHERE proname = %s AND pronamespace = current_schema()::regnamespace"
        " ORDER BY pronargs DESC LIMIT 1",  # the claim of limited tasks of 0007 has fewer
        [function],
    ).fetchone()
    assert row is not None
    source, names, types, settings = row
    arguments_ = [name for name in names or [] if name.startswith("p_")]  # not the columns
    parameters = list(zip(arguments_, (t.strip() for t in types.split(",")), strict=False))
    declared = source.partition("DECLARE")[2].partition("BEGIN")[0] if "DECLARE" in source else ""
    variables = re.findall(r"^\s*(v_\w+)\s+([\w\[\] ]+?)\s*(?::=.*)?;", declared, re.M)
    parameters += variables
    values = [v.strip() for v in split_arguments(arguments) if v.strip()]
    # Arguments left out take their defaults (NULL, for asyncq's functions).
    values += [f"NULL::{type_}" for _, type_ in parameters[len(values) : len(arguments_)]]
    values += [f"NULL::{type_}" for _, type_ in variables]
    found = statements(source)
    assert found, f"{function} has no statement"
    plans = []
    with db.transaction(force_rollback=True):
        for setting in settings or []:  # an SQL function has none
            key, _, value = setting.partition("=")
            db.execute("SELECT set_config(%s, %s, true)", [key, value])
        for number, statement in enumerate(found):
            used = [
                (name, type_) for name, type_ in parameters if re.search(rf"\b{name}\b", statement)
            ]
            for place, (name, _) in enumerate(used, 1):
                statement = re.sub(rf"\b{name}\b", f"${place}", statement)
            typed = f"({', '.join(type_ for _, type_ in used)})" if used else ""
            by_name = dict(zip([n for n, _ in parameters], values, strict=True))
            given = f"({', '.join(by_name[name] for name, _ in used)})" if used else ""
            db.execute(f"PREPARE plan_{number}{typed} AS {statement}")  # type: ignore[arg-type]
            try:
                with db.transaction():
                    explained = db.execute(
                        # Run, with costs: jit says so only then.
                        f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE plan_{number}{given}"  # type: ignore[arg-type]
                    ).fetchone()
            except psycopg.Error:
                explained = db.execute(
                    f"EXPLAIN (FORMAT JSON) EXECUTE plan_{number}{given}"  # type: ignore[arg-type]
                ).fetchone()
            db.execute(f"DEALLOCATE plan_{number}")  # type: ignore[arg-type]
            assert explained is not None
            plan = explained[0] if isinstance(explained[0], list) else json.loads(explained[0])
            # A turned-off path costs 1e10 before PostgreSQL 18, past jit's threshold: with
            # jit on, each call would compile its plan.
            plans.append({**plan[0]["Plan"], "JIT": plan[0].get("JIT")})
    return plans


def split_arguments(arguments: str) -> list[str]:
    """``arguments`` split at its top-level commas."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(arguments):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char == "," and depth == 0 and arguments[:at].count("'") % 2 == 0:
            parts.append(arguments[start:at])
            start = at + 1
    return [*parts, arguments[start:]]


def nodes(
    plan: dict[str, Any], limited: bool = False, *, inputs_only: bool = False
) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every node of a plan, each with whether a Limit above it stops it (an InitPlan or a
    SubPlan runs on its own: a Limit above it does not stop it); ``inputs_only``: not
    those, only what feeds the node."""
    yield plan, limited
    for child in plan.get("Plans", []):
        own = child.get("Parent Relationship") in ("InitPlan", "SubPlan")
        if own and inputs_only:
            continue
        stopped = False if own else limited or plan["Node Type"] == "Limit"
        yield from nodes(child, stopped, inputs_only=inputs_only)


# The indexes of the jobs of one state or a few: the queued, running, waiting and failed
# ones, never the done rows that make up most of the table. A count of a state reads all of
# its index.
STATE_INDEXES = {
    "asyncq_jobs_ready",
    "asyncq_jobs_ready_by_queue",
    "asyncq_jobs_ready_by_task",
    "asyncq_jobs_leases",
    "asyncq_jobs_ended",
    "asyncq_jobs_waiting",
    "asyncq_jobs_waiting_for",
}


def faults(plan: dict[str, Any], *, counts: bool = False) -> list[str]:
    """What a plan does that it must not. Each read of asyncq_jobs is bounded: by an index
    condition, by a Limit over an ordered scan of the index of a state (never of all rows,
    whose filter may pass none), or by the running jobs (the index of leases holds them
    only); a look-up by id is a look-up in the primary key; a sort sorts only such bounded
    reads (or rows already read). With ``counts``, a statement that
    counts jobs by state may read the whole index of a state (not the done rows)."""
    found = ["compiled by jit"] if plan.get("JIT") else []
    reads = []
    for node, limited in nodes(plan):
        if node.get("Relation Name") != "asyncq_jobs" or node["Node Type"] == "ModifyTable":
            continue
        if node["Node Type"] == "Bitmap Heap Scan":  # read through its bitmap index scans
            bitmaps = [b for b, _ in nodes(node) if b["Node Type"] == "Bitmap Index Scan"]
            reads += [({**b, "Filter": node.get("Filter", "")}, limited) for b in bitmaps]
        else:
            reads.append((node, limited))
    for node, limited in reads:
        index = node.get("Index Name")
        conditions = " ".join(str(node.get(key, "")) for key in ("Index Cond", "Filter"))
        if index is None:
            found.append(f"{node['Node Type']} on asyncq_jobs")
        elif (
            "Index Cond" not in node
            and index != "asyncq_jobs_leases"
            and not (counts and index in STATE_INDEXES)
            and not (limited and index in STATE_INDEXES)
        ):
            found.append(f"a scan of all of {index}")
        elif re.search(r"\bid = ANY\b", conditions) and index != "asyncq_jobs_pkey":
            found.append(f"a look-up by id in {index}: {conditions}")
    for node, _ in nodes(plan):
        if node["Node Type"] != "Sort":
            continue
        # A sort of the rows of a look-up by id (at most the ids given) is bounded.
        for below, limited in nodes(node, inputs_only=True):
            read = below.get("Relation Name") == "asyncq_jobs"
            by_id = below.get("Index Name") == "asyncq_jobs_pkey" or any(
                b.get("Index Name") == "asyncq_jobs_pkey" for b, _ in nodes(below)
            )
            if read and below["Node Type"] != "ModifyTable" and not limited and not by_id:
                found.append(f"a sort ({node['Sort Key']}) of rows read from asyncq_jobs")
    return found


@pytest.mark.parametrize("state", STATES)
def test_every_function_plans_bounded_index_reads_whatever_the_statistics(
    db: psycopg.Connection[Any], ready_by_task: None, state: str
) -> None:
    STATES[state](db)
    for function, calls in CALLS.items():
        for arguments in calls:
            for plan in generic_plans(db, function, arguments):
                found = faults(plan, counts=function in COUNTS)
                assert not found, (
                    f"{function}({arguments}) on {state} statistics: {found}\n"
                    + json.dumps(plan, indent=1)
                )


@pytest.mark.parametrize("state", STATES)
def test_the_claim_reads_the_index_of_its_queues(db: psycopg.Connection[Any], state: str) -> None:
    """Any queue: the ready index, in order; one queue: that queue's; several: that
    queue's for each (never the ready index filtered by queue, which reads every ready
    job of the other queues ahead of theirs); queues paused or not."""
    STATES[state](db)
    for paused in (False, True):
        if paused:
            db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('other', now())")
        plans = generic_plans(db, "asyncq_claim", CALLS["asyncq_claim"][0])
        for plan in plans:
            assert not faults(plan), f"paused: {paused}, {faults(plan)}"
        any_queue, one, several = (
            {node.get("Index Name") for node, _ in nodes(plan)} for plan in plans
        )
        assert "asyncq_jobs_ready" in any_queue, any_queue
        for indexes in (one, several):
            assert "asyncq_jobs_ready_by_queue" in indexes, indexes
            assert "asyncq_jobs_ready" not in indexes, indexes


# The writes of running jobs by id, each given jobs 1 to 10 (CALLS).
WRITES_BY_ID = [
    "asyncq_mark_done",
    "asyncq_mark_done_results",
    "asyncq_mark_failed",
    "asyncq_mark_snoozed",
    "asyncq_mark_cancelled",
    "asyncq_release",
    "asyncq_heartbeat",
    "asyncq_give_back",
    "asyncq_mark_done_with",
    "asyncq_write_progress",
]


@pytest.mark.parametrize("function", WRITES_BY_ID)
def test_a_write_by_id_locks_its_rows_in_the_order_of_their_ids(
    db: psycopg.Connection[Any], dsn: str, function: str
) -> None:
    """As a gather's suspension locks the jobs it waits for (FOR SHARE, by id): a write
    that took them by their places in the table (a bitmap scan) could hold a row the
    suspension came to next while waiting for one it held, a deadlock. The jobs are
    written in the reverse order of their ids; a holder of job 10 makes the write wait
    there, having locked jobs 1 to 9 first."""
    db.execute(
        "INSERT INTO asyncq_jobs (id, task_name, status, locked_by, claims, attempts, lease,"
        " locked_at, expires_at)"
        " SELECT g, 't', 'running', 'w', 1, 1, '30 s', now(), now() + interval '30 s'"
        " FROM generate_series(10, 1, -1) AS g"
    )
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as writer:
        holder.execute("SELECT 1 FROM asyncq_jobs WHERE id = 10 FOR SHARE")
        pid = writer.info.backend_pid
        arguments = CALLS[function][0]
        with ThreadPoolExecutor(1) as pool:
            written = pool.submit(writer.execute, f"SELECT * FROM {function}({arguments})")  # type: ignore[arg-type]
            try:
                wait_until(
                    lambda: (
                        db.execute(
                            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                            [pid],
                        ).fetchone()
                        == (True,)
                    ),
                    what="the write waiting for job 10",
                )
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    holder.execute("SELECT 1 FROM asyncq_jobs WHERE id = 1 FOR SHARE NOWAIT")
            finally:
                holder.rollback()  # the write goes on
            written.result(timeout=30)


def pages_read(conn: psycopg.Connection[Any], call: str) -> int:
    """The pages of shared buffers a call reads, its function's statements included."""
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM {call}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_a_session_planned_on_the_empty_table_keeps_reading_indexes(
    db: psycopg.Connection[Any], ready_by_task: None, dsn: str
) -> None:
    """Through a burst of 100,000 jobs, a session that ran everything first on the empty,
    analyzed table (as a worker warms its claim when it starts) reads a small part of the
    table's pages per call; a sequential scan reads them all."""
    calls = [
        f"{function}({arguments})"
        for function, all_ in CALLS.items()
        for arguments in all_
        # It counts every queued job: its index reads are bounded by them, not by a claim.
        if function not in COUNTS
    ]
    stats_empty(db)
    with psycopg.connect(dsn, autocommit=True) as session:
        for call in calls:
            for _ in range(6):  # past the five custom plans of a prepared statement
                session.execute(f"SELECT * FROM {call}")  # type: ignore[arg-type]
        # What those calls wrote goes (a DELETE: a TRUNCATE would make the session plan
        # again), and the burst comes.
        for table in ("asyncq_jobs", "asyncq_steps", "asyncq_waits", "asyncq_events"):
            db.execute(f"DELETE FROM {table}")  # type: ignore[arg-type]
        db.execute(
            "INSERT INTO asyncq_jobs (id, task_name, status, locked_by, claims, attempts,"
            " lease, locked_at, expires_at)"
            " SELECT g, 't', 'running', 'w', 1, 1, '30 s', now(), now() + interval '30 s'"
            " FROM generate_series(1, 10) AS g"
        )
        db.execute("SELECT setval(pg_get_serial_sequence('asyncq_jobs', 'id'), 10)")
        db.execute(
            "INSERT INTO asyncq_jobs (task_name, queue)"
            " SELECT 't', CASE WHEN g % 2 = 0 THEN 'default' ELSE 'other' END"
            " FROM generate_series(1, 100000) AS g"
        )
        row = db.execute("SELECT pg_relation_size('asyncq_jobs') / 8192").fetchone()
        assert row is not None
        table_pages = int(row[0])
        for call in calls:
            pages = pages_read(session, call)
            assert pages < table_pages / 4, f"{call} read {pages} pages of {table_pages}"


def test_the_plain_path_finds_its_tables_whatever_the_search_path(
    db: psycopg.Connection[Any], dsn: str
) -> None:
    """The claim and the done write set no search_path (migration 0027: a setting costs
    every call): each name in them is the schema's, found from a session whose search
    path does not hold it."""
    for function in ("asyncq_claim", "asyncq_mark_done"):
        row = db.execute(
            "SELECT proconfig FROM pg_proc WHERE proname = %s"
            " AND pronamespace = current_schema()::regnamespace",
            [function],
        ).fetchone()
        assert row is not None
        assert not any(s.startswith("search_path=") for s in row[0] or []), row[0]
    schema = db.execute("SELECT current_schema()").fetchone()
    assert schema is not None
    db.execute("INSERT INTO asyncq_jobs (task_name) VALUES ('t')")
    db.execute("INSERT INTO asyncq_result_listeners (listener) VALUES ('l')")
    with psycopg.connect(dsn, autocommit=True) as session:
        session.execute("SET search_path = pg_catalog")
        claimed = session.execute(
            f"SELECT job_id, job_claims FROM {schema[0]}.asyncq_claim('w', 10, '30 s', NULL)"  # type: ignore[arg-type]
        ).fetchall()
        assert [c[0] for c in claimed] == [1]
        ended = session.execute(
            f"SELECT * FROM {schema[0]}.asyncq_mark_done('w', '{{1}}', '{{1}}')"  # type: ignore[arg-type]
        ).fetchall()
        assert ended == [(1,)]
    assert db.execute("SELECT status::text FROM asyncq_jobs").fetchall() == [("done",)]
