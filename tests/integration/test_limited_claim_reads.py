"""The limited claim reads what it claims, not the backlog: a limited task with one ready
job behind 30,000 of another task's is found through asyncq_jobs_ready_by_task, which
the migration of an App with limits makes (and of one without, does not); with the
statistics skewed that way, the unlimited tasks' jobs are still read in index order.
Rows read are counted by the server for the claim's own transaction."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import asyncq
from asyncq.limits import ClaimLimits
from asyncq.store import GROUP_SCAN

pytestmark = pytest.mark.anyio

BACKLOG = 30_000


def limited_app(dsn: str) -> asyncq.App:
    app = asyncq.App(dsn)

    @app.task(name="free")
    async def free() -> None:
        pass

    @app.task(name="capped", concurrency=5)
    async def capped() -> None:
        pass

    @app.task(name="rated", rate_limit="100/s")
    async def rated() -> None:
        pass

    return app


def has_index(db: psycopg.Connection[Any]) -> bool:
    row = db.execute("SELECT to_regclass('asyncq_jobs_ready_by_task') IS NOT NULL").fetchone()
    return bool(row and row[0])


async def test_only_an_app_with_limits_makes_the_index(throwaway_dsn: str) -> None:
    with psycopg.connect(throwaway_dsn, autocommit=True) as db:
        async with asyncq.App(throwaway_dsn) as plain:
            await plain.migrate()
        assert not has_index(db)
        async with limited_app(throwaway_dsn) as limited:
            await limited.migrate()
            await limited.migrate()  # idempotent
        assert has_index(db)


async def claim_and_count_reads(app: asyncq.App) -> tuple[list[str], int, int]:
    """Run the limited claim in a transaction that is rolled back: the tasks claimed, and
    the rows of asyncq_jobs it read by index and by sequential scan."""
    params = claim_params(app)
    async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(app.store.q["claim_limited"], params)
        claimed = [row[1] for row in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT coalesce(idx_tup_fetch, 0), coalesce(seq_tup_read, 0)"
            " FROM pg_stat_xact_user_tables WHERE relid = 'asyncq_jobs'::regclass"
        )
        row = await cur.fetchone()
        assert row is not None
        return claimed, int(row[0]), int(row[1])


async def test_a_rare_limited_task_is_found_without_reading_the_backlog(
    throwaway_dsn: str,
) -> None:
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            db.execute(
                "INSERT INTO asyncq_jobs (task_name) SELECT 'free' FROM generate_series(1, %s)",
                (BACKLOG,),
            )
            db.execute("INSERT INTO asyncq_jobs (task_name, priority) VALUES ('capped', 1)")
            db.execute("VACUUM ANALYZE asyncq_jobs")
        claimed, by_index, by_scan = await claim_and_count_reads(app)
    assert sorted(claimed) == ["capped"] + ["free"] * 9
    assert by_scan == 0
    # The ten claimed rows, the few read around them, and the rows locked; not 30,000.
    assert by_index < 200, by_index


async def test_the_free_tasks_are_found_past_a_backlog_held_by_its_rate_limit(
    throwaway_dsn: str,
) -> None:
    """A rate-limited task whose starts are used up holds 30,000 ready jobs at the head of
    the ready order; the claim takes the free task's jobs behind them without reading
    them all."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            db.execute(
                "INSERT INTO asyncq_jobs (task_name, run_at)"
                " SELECT 'rated', now() - interval '1 hour' FROM generate_series(1, %s)",
                (BACKLOG,),
            )
            db.execute(
                "INSERT INTO asyncq_jobs (task_name) SELECT 'free' FROM generate_series(1, 50)"
            )
            db.execute("INSERT INTO asyncq_rate_starts VALUES ('rated', now(), 100)")
            db.execute("VACUUM ANALYZE asyncq_jobs")
        claimed, by_index, by_scan = await claim_and_count_reads(app)
    assert claimed == ["free"] * 10
    assert by_scan == 0
    assert by_index < 200, by_index


def held_backlog_and_free_jobs(db: psycopg.Connection[Any]) -> list[int]:
    """50 jobs of a rate-limited task whose starts are used up, at the head of the ready
    order, and behind them the unlimited jobs of two tasks (one this App does not know):
    the ids of the first four in the claim's order (by priority, then run_at), which is
    not the order they were written in."""

    def job(task: str, ago: str, priority: int = 0, queue: str = "default") -> int:
        row = db.execute(
            "INSERT INTO asyncq_jobs (task_name, queue, priority, run_at)"
            " VALUES (%s, %s, %s, now() - %s::interval) RETURNING id",
            (task, queue, priority, ago),
        ).fetchone()
        assert row is not None
        return int(row[0])

    for _ in range(50):
        job("rated", "5 hours", priority=9)
    db.execute("INSERT INTO asyncq_rate_starts VALUES ('rated', now(), 100)")
    job("free", "30 minutes")  # written first, but beyond the batch
    job("ghost", "10 minutes")
    first = [
        job("free", "0 seconds", priority=5),
        job("ghost", "1 hour"),
        job("free", "2 hours"),
        job("ghost", "3 hours"),
    ]
    job("free", "-1 hour", priority=9)  # not due
    job("free", "6 hours", priority=9, queue="held")
    job("free", "7 hours", priority=9, queue="elsewhere")
    return first


async def claim_ids(app: asyncq.App, **params: Any) -> list[int]:
    async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
        cur = await conn.execute(app.store.q["claim_limited"], claim_params(app) | params)
        return sorted(row[0] for row in await cur.fetchall())


async def test_past_a_held_backlog_the_free_jobs_come_in_the_claims_order(
    throwaway_dsn: str,
) -> None:
    """Behind a held backlog, a worker of every queue takes the unlimited jobs task by
    task and merges them: by priority, then run_at, over every task not limited (a task
    this App does not know included), and none not yet due."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            first = held_backlog_and_free_jobs(db)
            db.execute("DELETE FROM asyncq_jobs WHERE queue <> 'default'")
        assert await claim_ids(app, limit=4) == sorted(first)


async def test_past_a_held_backlog_a_worker_of_some_queues_takes_only_theirs(
    throwaway_dsn: str,
) -> None:
    """The same for a worker of some queues, one of them paused: the jobs of the other
    queue and of the paused one are left, in the claim's order all the same."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            first = held_backlog_and_free_jobs(db)
            db.execute("INSERT INTO asyncq_queues (name, paused_at) VALUES ('held', now())")
            assert await claim_ids(app, limit=4, queues=["default", "held"]) == sorted(first)
            db.execute("DELETE FROM asyncq_jobs WHERE queue = 'elsewhere'")
            assert await claim_ids(app, limit=4) == sorted(first)  # every queue, one paused


HELD = "asyncq.claim_head_held"


def hold_the_head(db: psycopg.Connection[Any], *, free: int, starts: int = 1_000_000) -> None:
    """300 ready jobs of the rate-limited task at the head of the ready order, ``starts``
    of its starts counted in this second (its rate is 100 a second: 100 or more hold it),
    and ``free`` unlimited jobs behind them."""
    db.execute(
        "INSERT INTO asyncq_jobs (task_name, run_at)"
        " SELECT 'rated', now() - interval '1 hour' FROM generate_series(1, 300)"
    )
    db.execute(
        "INSERT INTO asyncq_jobs (task_name) SELECT 'free' FROM generate_series(1, %s)", (free,)
    )
    db.execute("INSERT INTO asyncq_rate_starts VALUES ('rated', now(), %s)", (starts,))


def claim_on(
    conn: psycopg.Connection[Any], db: psycopg.Connection[Any], app: asyncq.App
) -> tuple[list[str], int, str]:
    """One limited claim of 10 on ``conn``, committed: the tasks claimed, how many times it
    scanned the ready order's index (that is, read the head), and the connection's
    asyncq.claim_head_held after it (its count and schema)."""

    def head_reads() -> int:
        row = db.execute(
            "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'asyncq_jobs_ready'"
        ).fetchone()
        assert row is not None
        return int(row[0])

    before = head_reads()
    claimed = [row[1] for row in conn.execute(app.store.q["claim_limited"], claim_params(app))]
    row = conn.execute("SELECT current_setting(%s, true), pg_stat_force_next_flush()", (HELD,))
    mark = row.fetchone()
    conn.commit()  # the server reports the claim's statistics before it answers
    assert mark is not None
    return claimed, head_reads() - before, " ".join((mark[0] or "").split(" ")[:2])


async def test_a_claim_that_finds_the_head_held_goes_past_it_on_its_connections_next_claims(
    throwaway_dsn: str,
) -> None:
    """A claim that finds the head of the ready order held by a rate-limited backlog says
    so on its connection; the next 15 claims there take the free jobs behind it without
    reading the head, the sixteenth reads it again, and one that finds it no longer held
    clears the setting. Another connection knows nothing of it."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
    with (
        psycopg.connect(throwaway_dsn, autocommit=True) as db,
        psycopg.connect(throwaway_dsn) as conn,
    ):
        hold_the_head(db, free=200, starts=100)
        db.execute("VACUUM ANALYZE asyncq_jobs")
        (schema,) = conn.execute("SELECT current_schema()").fetchone() or ("",)

        claimed, read, mark = claim_on(conn, db, app)
        assert (claimed, read, mark) == (["free"] * 10, 1, f"0 {schema}")
        for skipped in range(1, 16):
            claimed, read, mark = claim_on(conn, db, app)
            assert (claimed, read, mark) == (["free"] * 10, 0, f"{skipped} {schema}")
        claimed, read, mark = claim_on(conn, db, app)
        assert (claimed, read, mark) == (["free"] * 10, 1, f"0 {schema}")  # still held

        db.execute("DELETE FROM asyncq_jobs WHERE task_name = 'rated'")
        conn.execute("SELECT set_config(%s, %s, false)", (HELD, f"15 {schema}"))
        claimed, read, mark = claim_on(conn, db, app)
        assert (claimed, read, mark) == (["free"] * 10, 1, "")
        claimed, read, mark = claim_on(conn, db, app)
        assert (claimed, read, mark) == (["free"] * 10, 1, "")

        with psycopg.connect(throwaway_dsn) as other:
            (unset,) = other.execute("SELECT current_setting(%s, true)", (HELD,)).fetchone() or (
                "",
            )
            assert unset is None


async def test_past_a_held_head_what_is_not_remembered_waits_for_the_next_look(
    throwaway_dsn: str,
) -> None:
    """Behind a held head, a connection's claims read each task's jobs from where the last
    one found its first: a job of higher priority is taken at once, but one written with an
    earlier run_at at the same priority, and the first job of a task not seen at the last
    look, wait for the claim that looks again (the 16th after it), which takes them."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
    params = claim_params(app)
    with (
        psycopg.connect(throwaway_dsn, autocommit=True) as db,
        psycopg.connect(throwaway_dsn) as conn,
    ):
        hold_the_head(db, free=200)

        def job(task: str, priority: int, ago: str) -> int:
            row = db.execute(
                "INSERT INTO asyncq_jobs (task_name, priority, run_at)"
                " VALUES (%s, %s, now() - %s::interval) RETURNING id",
                (task, priority, ago),
            ).fetchone()
            assert row is not None
            return int(row[0])

        def claim() -> set[int]:
            ids = {row[0] for row in conn.execute(app.store.q["claim_limited"], params)}
            conn.commit()
            return ids

        assert len(claim()) == 10  # found the head held, looked for the tasks
        late = {job("free", 0, "1 day"), job("ghost", 0, "2 hours")}
        for _ in range(14):
            assert not late & claim()
        urgent = job("free", 5, "0 seconds")
        taken = claim()
        assert urgent in taken
        assert not late & taken
        assert late <= claim()  # the 16th since the look: it looks again


async def test_past_a_held_head_a_claim_short_of_jobs_looks_for_the_tasks_at_once(
    throwaway_dsn: str,
) -> None:
    """Behind a held head, a claim that finds fewer jobs than it asks for where the tasks'
    jobs were looks for the tasks again in the same claim, without reading the head: the
    first job of a task that had none at the last look does not wait for the 16th claim."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
    with (
        psycopg.connect(throwaway_dsn, autocommit=True) as db,
        psycopg.connect(throwaway_dsn) as conn,
    ):
        hold_the_head(db, free=5)
        db.execute("VACUUM ANALYZE asyncq_jobs")
        (schema,) = conn.execute("SELECT current_schema()").fetchone() or ("",)

        claimed, read, mark = claim_on(conn, db, app)
        assert (claimed, read, mark) == (["free"] * 5, 1, f"0 {schema}")
        db.execute("INSERT INTO asyncq_jobs (task_name) VALUES ('ghost'), ('free')")
        claimed, read, mark = claim_on(conn, db, app)
        assert (sorted(claimed), read, mark) == (["free", "ghost"], 0, f"1 {schema}")


async def test_what_another_app_remembered_does_not_lift_a_limit(throwaway_dsn: str) -> None:
    """A connection's mark is left by whichever App claimed on it last: an App that limits
    a task the mark remembers as unlimited takes that task's jobs under its own limit."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
    stricter = asyncq.App(throwaway_dsn)

    @stricter.task(name="free", concurrency=2)
    async def free() -> None:
        pass

    @stricter.task(name="rated", rate_limit="100/s")
    async def rated() -> None:
        pass

    with (
        psycopg.connect(throwaway_dsn, autocommit=True) as db,
        psycopg.connect(throwaway_dsn) as conn,
    ):
        hold_the_head(db, free=200)
        claimed = [row[1] for row in conn.execute(app.store.q["claim_limited"], claim_params(app))]
        conn.commit()
        (mark,) = conn.execute("SELECT current_setting(%s, true)", (HELD,)).fetchone() or ("",)
        assert claimed == ["free"] * 10
        assert '"free"' in mark
        db.execute("DELETE FROM asyncq_jobs WHERE status <> 'queued'")  # none running

        params = claim_params(stricter)
        claimed = [row[1] for row in conn.execute(stricter.store.q["claim_limited"], params)]
        conn.commit()
        assert claimed == ["free", "free"]


async def test_claims_going_past_the_head_take_what_reading_it_takes(throwaway_dsn: str) -> None:
    """A connection that last found the head held goes past it, whatever the head holds
    now: the jobs it takes are those a claim reading the head takes, in a head that is not
    held (ready jobs of several tasks, some not due, of several priorities) and behind a
    held one. A worker of some queues does not go past it, and leaves the setting as it is."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            (schema,) = db.execute("SELECT current_schema()").fetchone() or ("",)
            held = f"3 {schema}"  # no tasks' places: they are looked for, then remembered
            for task, ago, priority in [
                ("free", "1 hour", 0),
                ("ghost", "2 hours", 0),
                ("capped", "3 hours", 0),
                ("free", "-1 hour", 5),
                ("ghost", "0 seconds", 5),
                ("free", "4 hours", 0),
                ("capped", "1 minute", 5),
                ("free", "5 minutes", 0),
            ] * 3:
                db.execute(
                    "INSERT INTO asyncq_jobs (task_name, priority, run_at)"
                    " VALUES (%s, %s, now() - %s::interval)",
                    (task, priority, ago),
                )

            async def claimed(mark: str | None, **params: Any) -> tuple[list[int], str | None]:
                async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
                    if mark is not None:
                        await conn.execute("SELECT set_config(%s, %s, true)", (HELD, mark))
                    cur = await conn.execute(
                        app.store.q["claim_limited"], claim_params(app) | params
                    )
                    ids = sorted(row[0] for row in await cur.fetchall())
                    cur = await conn.execute("SELECT current_setting(%s, true)", (HELD,))
                    row = await cur.fetchone()
                    return ids, row[0] if row else None

            for limit in (1, 4, 10, 30):
                reading, mark = await claimed(None, limit=limit)
                # the head is held for a claim of 1 (two capped jobs lead it), not for more
                assert (mark in (None, "")) == (limit > 1), (limit, mark)
                looked, mark = await claimed(held, limit=limit)
                assert mark is not None
                assert (looked, mark.split(" ")[0]) == (reading, "4")
                remembered, after = await claimed(mark, limit=limit)  # from the places found
                assert after is not None
                assert (remembered, after.split(" ")[0]) == (reading, "5")
            some = await claimed(held, limit=4, queues=["default"])
            assert some == ((await claimed(None, limit=4, queues=["default"]))[0], held)

            db.execute("DELETE FROM asyncq_jobs")
            first = held_backlog_and_free_jobs(db)
            db.execute("DELETE FROM asyncq_jobs WHERE queue <> 'default'")
            looked, mark = await claimed(held, limit=4)
            assert mark is not None
            assert (looked, mark.split(" ")[0]) == (sorted(first), "4")
            assert (await claimed(mark, limit=4))[0] == sorted(first)


async def test_a_claim_takes_limited_jobs_for_its_free_runners_only(throwaway_dsn: str) -> None:
    """Of a claim of 10 with room for 3 limited tasks' jobs, at most 3 are theirs (the
    first 3 in the claim's order, over both tasks), the rest another task's; the function
    of ten arguments, which workers of schema version 10 call, takes up to the batch."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
        with psycopg.connect(throwaway_dsn, autocommit=True) as db:
            for task, ago in [("capped", 9), ("rated", 8), ("capped", 7), ("rated", 6)] * 2:
                db.execute(
                    "INSERT INTO asyncq_jobs (task_name, run_at)"
                    " VALUES (%s, now() - make_interval(hours => %s))",
                    (task, ago),
                )
            db.execute(
                "INSERT INTO asyncq_jobs (task_name) SELECT 'free' FROM generate_series(1, 20)"
            )
        async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
            params = claim_params(app) | {"limited": 3}
            cur = await conn.execute(app.store.q["claim_limited"], params)
            claimed = sorted(row[1] for row in await cur.fetchall())
        assert claimed == sorted(["capped", "capped", "rated"] + ["free"] * 7)
        async with app.pool.connection() as conn, conn.transaction(force_rollback=True):
            params = claim_params(app)
            cur = await conn.execute(
                "SELECT job_task_name FROM asyncq_claim_limited("
                " %(worker)s, %(limit)s, %(lease)s, %(queues)s, %(scan)s, %(names)s,"
                " %(concurrency)s, %(rate)s, %(period)s, %(group_concurrency)s)",
                params,
            )
            claimed = sorted(row[0] for row in await cur.fetchall())
        assert claimed == sorted(["capped"] * 4 + ["rated"] * 4 + ["free"] * 2)


async def test_without_the_index_a_worker_with_limits_says_so(
    throwaway_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with asyncq.App(throwaway_dsn) as plain:
        await plain.migrate()
    app = limited_app(throwaway_dsn)
    caplog.set_level(logging.WARNING, logger="asyncq.worker")
    async with app:
        await app.run_worker(drain=True, handle_signals=False)
    assert "asyncq_jobs_ready_by_task is missing" in caplog.text
    assert "capped, rated" in caplog.text


def claim_params(app: asyncq.App) -> dict[str, Any]:
    limits = ClaimLimits.of((name, task.limits) for name, task in app.tasks.items())
    assert limits is not None
    return {
        "worker": "w",
        "limit": 10,
        "limited": 10,
        "lease": timedelta(seconds=30),
        "queues": None,
        "scan": GROUP_SCAN,
        **limits.params(),
    }


async def test_limited_claims_wait_for_the_one_before_and_see_what_it_started(
    throwaway_dsn: str,
) -> None:
    """A claim that comes while another holds the limits lock waits for it, then sees the
    jobs it started: of a task at concurrency 5, two claims start 5, not 10."""
    app = limited_app(throwaway_dsn)
    async with app:
        await app.migrate()
    params = claim_params(app)
    query = app.store.q["claim_limited"]
    with (
        psycopg.connect(throwaway_dsn, autocommit=True) as db,
        psycopg.connect(throwaway_dsn) as first,
        psycopg.connect(throwaway_dsn, autocommit=True) as second,
    ):
        db.execute(
            "INSERT INTO asyncq_jobs (task_name) SELECT 'capped' FROM generate_series(1, 20)"
        )
        started = first.execute(query, params).fetchall()  # its transaction stays open
        assert len(started) == 5
        later: list[Any] = []
        thread = threading.Thread(target=lambda: later.extend(second.execute(query, params)))
        thread.start()
        waiting = False
        while thread.is_alive() and not waiting:
            row = db.execute(
                "SELECT wait_event = 'advisory' FROM pg_stat_activity WHERE pid = %s",
                (second.info.backend_pid,),
            ).fetchone()
            waiting = bool(row and row[0])
        assert waiting, "the second claim did not wait for the first"
        first.commit()
        thread.join(30)
        assert later == []
        (running,) = db.execute(
            "SELECT count(*) FROM asyncq_jobs WHERE status = 'running'"
        ).fetchone()
        assert running == 5
