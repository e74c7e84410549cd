"""The only module that runs asyncq's runtime SQL: one method per named query.

The SQL itself lives in ``sql/queries.sql``. A `Store` is bound to a schema: with
None, the names there resolve on the connection's search path (its current
schema); with a schema, they are qualified with it, so an App's jobs are found
whatever the search path of the connection they travel on.

The statements that defers, results and the admin calls run raise asyncq's own error
for two failures that name their cure (`asyncq_error`), chained from psycopg's: a
missing asyncq table (`SchemaNotMigrated`: run the migrations) and a lost or duplicate
prepared statement (`PreparedStatementsRefused`: PgBouncer in transaction mode). A
worker's own statements are checked by its preflight and its supervisor.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from psycopg import AsyncConnection, Connection, errors, sql

from asyncq.errors import AsyncqError, PreparedStatementsRefused, SchemaNotMigrated
from asyncq.job import Job
from asyncq.limits import ClaimLimits, Override
from asyncq.schedule import Schedule

Conn = AsyncConnection[Any]
SyncConn = Connection[Any]
P = ParamSpec("P")
R = TypeVar("R")


class NewJob(NamedTuple):
    """A job row to write (its arguments already encoded as JSON)."""

    task_name: str
    queue: str
    args: str
    priority: int
    run_at: datetime | None
    delay: float
    max_attempts: int
    group_key: str | None = None
    trace_context: str | None = None
    """The trace context of the defer's span, as a JSON object (written by traced defers
    only: an App with ``tracing=True``)."""


class FireResult(NamedTuple):
    """A schedule's slot after a fire: the job made now (None: none), and whether the slot
    is settled (fired, now or before, or not this worker's to fire)."""

    schedule: str
    job_id: int | None
    settled: bool


class ScheduleRow(NamedTuple):
    name: str
    task_name: str
    cron: str
    tz: str
    queue: str | None
    last_slot: datetime
    last_job_id: int | None
    last_job_status: str | None
    now: datetime


class JobEnding(NamedTuple):
    """A job's status and, once it has ended, its result (JSON text) or last error."""

    id: int
    status: str
    result: str | None
    last_error: str | None


class WorkerFacts(NamedTuple):
    schema: str
    server_encoding: str


class WorkerRow(NamedTuple):
    """What a worker writes of itself in asyncq_workers."""

    id: str
    host: str
    pid: int
    version: str
    app: str | None
    queues: list[str] | None
    concurrency: int
    beat: timedelta


def _fence(worker: str, jobs: Sequence[Job], **columns: Sequence[Any]) -> dict[str, Any]:
    """The parameters every write after the claim is fenced on: this worker, each job's
    id and the claim it holds it by; ``columns`` hold a value for each job.

    All of them in the order of the ids (jobs end in any order), and of the claims where
    an id comes twice (a job claimed again here while its earlier outcome waited): the
    statement then locks its rows in that order, as a cancel locks its own, and the two
    do not wait for each other in a cycle (a deadlock, which costs the loser a second and
    a retry). A transaction of several such statements (a batch of outcomes of several
    kinds) locks statement by statement, and can still meet a cancel in one: both sides
    retry it. The writes of done outcomes and the heartbeat find each id's place in the
    arrays by a binary search, which needs that order (mark_done in queries.sql)."""
    ids = [j.id for j in jobs]
    claims = [j.claim for j in jobs]
    if any(map(operator.ge, ids, itertools.islice(ids, 1, None))):
        order = sorted(range(len(ids)), key=lambda i: (ids[i], claims[i]))
        ids = [ids[i] for i in order]
        claims = [claims[i] for i in order]
        columns = {name: [values[i] for i in order] for name, values in columns.items()}
    return {
        "worker": worker,
        "ids": _bigint_array(ids),
        "claims": _bigint_array(claims),
        **{name: list(values) for name, values in columns.items()},
    }


def _any(values: Sequence[str | None] | None) -> bool:
    return values is not None and any(v is not None for v in values)


def _ended(
    worker: str,
    jobs: Sequence[Job],
    logs: Sequence[str | None] | None,
    progress: Sequence[str | None] | None,
    **columns: Sequence[Any],
) -> dict[str, Any]:
    """`_fence` for a write that ends attempts and records them: with each attempt's logs
    and last progress (JSON text or None; NULL arrays when no attempt has any)."""
    if _any(logs) or _any(progress):
        none = [None] * len(jobs)
        return _fence(worker, jobs, logs=logs or none, progress=progress or none, **columns)
    params = _fence(worker, jobs, **columns)
    params["logs"] = params["progress"] = None
    return params


_first = operator.itemgetter(0)
# A claimed row made a Job by tuple's own __new__ (the named tuple's is Python code).
_new_job = tuple.__new__


def _bigint_array(values: list[int]) -> str:
    """``values`` in PostgreSQL's text form of an array (the query casts it to bigint[]).
    psycopg dumps a list one element at a time in Python (about 0.4 µs each): for the two
    arrays of every outcome write, more than the worker's own bookkeeping of the job."""
    return "{" + ",".join(map(str, values)) + "}"


def _text_array(values: list[str]) -> str:
    """``values`` in PostgreSQL's text form of an array (the query casts it to text[]): each
    quoted, its backslashes and quotes escaped."""
    return (
        '{"' + '","'.join([v.replace("\\", "\\\\").replace('"', '\\"') for v in values]) + '"}'
        if values
        else "{}"
    )


def _timestamptz_array(values: list[datetime]) -> str:
    """Aware datetimes in PostgreSQL's text form of an array (cast to timestamptz[])."""
    return "{" + ",".join([v.isoformat() for v in values]) + "}"


# The insert of jobs given as a JSON array, by (grouped, traced).
_ARRAY_INSERTS = {
    (True, False): "insert_grouped",
    (True, True): "insert_grouped_traced",
    (False, True): "insert_traced",
}

REQUEUE_TRIES = 5
# How long a worker's transaction may sit idle (its worker frozen) before the server ends
# it, and its locks with it.
IDLE_LIMIT = "5s"
# Ready jobs of a task with group_concurrency that one claim looks at, outside its
# saturated groups: a group with more ready jobs than this, at the head of the queue,
# has its room filled first, and is then skipped by the next claims.
GROUP_SCAN = 1000

# The schema objects a query may name, outside string literals.
_OBJECTS = re.compile(r"(?<!')\b(asyncq_[a-z_]+)\b(?!')")


# What a statement through PgBouncer in transaction mode meets once psycopg prepares it:
# another client's statement of the same name on this server connection, or none there.
REFUSED_PREPARED: tuple[type[errors.Error], ...] = (
    errors.DuplicatePreparedStatement,
    errors.InvalidSqlStatementName,
)
_MEANINGFUL: tuple[type[errors.Error], ...] = (
    errors.UndefinedTable,
    errors.UndefinedFunction,
    *REFUSED_PREPARED,
)


def asyncq_error(
    exc: BaseException, *, database: str | None = None, schema: str | None = None
) -> AsyncqError | None:
    """The asyncq error that ``exc``, met by one of asyncq's statements, means: a missing
    asyncq table or function (`SchemaNotMigrated`), a prepared statement lost or refused
    (`PreparedStatementsRefused`); None for any other."""
    if isinstance(exc, errors.UndefinedTable | errors.UndefinedFunction):
        missing = _OBJECTS.search(exc.diag.message_primary or "")
        if missing is None:  # not one of asyncq's tables or functions
            return None
        what = "table" if isinstance(exc, errors.UndefinedTable) else "function"
        where = "" if database is None else f" in database {database!r}"
        if schema is not None:
            where += f", schema {schema!r}"
        return SchemaNotMigrated(
            f"there is no {missing[1]} {what}{where}: run `asyncq migrate MODULE:APP`"
            " (or `await app.migrate()`) first"
        )
    if isinstance(exc, REFUSED_PREPARED):
        said = " ".join((exc.diag.message_primary or type(exc).__name__).split())
        return PreparedStatementsRefused(
            f"the server refused a prepared statement ({said}): through PgBouncer in"
            " transaction mode, give the App prepare_threshold=None"
            " (the PgBouncer guide, docs/how-to/pgbouncer.md)"
        )
    return None


def _meaning(store: Store, exc: BaseException, conn: Conn | SyncConn) -> AsyncqError | None:
    return asyncq_error(exc, database=conn.info.dbname, schema=store.schema)


def _translating(
    method: Callable[Concatenate[Store, Conn, P], Awaitable[R]],
) -> Callable[Concatenate[Store, Conn, P], Awaitable[R]]:
    """``method`` raising `asyncq_error`'s errors in place of psycopg's."""

    @functools.wraps(method)
    async def translated(self: Store, conn: Conn, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(self, conn, *args, **kwargs)
        except _MEANINGFUL as exc:
            found = _meaning(self, exc, conn)
            if found is None:
                raise
            raise found from exc

    return translated


# The listing of each state (the list_* and count_* blocks): None lists every job.
_LISTINGS = {
    None: "all",
    "queued": "queued",
    "running": "running",
    "waiting": "waiting",
    "done": "done",
    "failed": "ended",
    "cancelled": "ended",
}


def _load_queries() -> dict[str, str]:
    text = resources.files("asyncq").joinpath("sql/queries.sql").read_text("utf-8")
    queries: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        queries[name.strip()] = "\n".join(lines).strip()
    return queries


QUERIES = _load_queries()


def _qualified(query: str, schema: str) -> str:
    template = _OBJECTS.sub(r"{\1}", query.replace("{", "{{").replace("}", "}}"))
    names = {name: sql.Identifier(schema, name) for name in set(_OBJECTS.findall(query))}
    return sql.SQL(template).format(**names).as_string()


class Store:
    def __init__(self, schema: str | None = None, *, traced: bool = False) -> None:
        self.schema = schema
        # An App with tracing: gathered defers write their trace contexts, and the claim
        # of limited tasks looks them up (the plain claims return them always).
        self.traced = traced
        self.q = (
            dict(QUERIES)
            if schema is None
            else {name: _qualified(query, schema) for name, query in QUERIES.items()}
        )

    def _insert_one(self, job: NewJob, unique_key: str | None) -> tuple[str, Any]:
        """The statement that writes one job, and its parameters."""
        if job.trace_context is not None or job.group_key is not None:
            # One job of a group, or with a trace context, as an array of one.
            query = self.q[_ARRAY_INSERTS[job.group_key is not None, job.trace_context is not None]]
            return query, {**job._asdict(), "args": f"[{job.args}]", "unique_key": unique_key}
        if unique_key is not None:
            return self.q["insert_job"], {**job._asdict(), "unique_key": unique_key}
        if job.run_at is None and not job.delay:
            params = (job.task_name, job.queue, job.args, job.priority, job.max_attempts)
            return self.q["insert_job_now"], params
        return self.q["insert_job_later"], job._asdict()

    async def insert_job(self, conn: Conn, job: NewJob, *, unique_key: str | None = None) -> int:
        """Write one job; with a unique key held by a live job, return that job's id instead."""
        query, params = self._insert_one(job, unique_key)
        try:  # not `_translating`: a coroutine more on the path of every lone defer
            while True:
                row = await (await conn.execute(query, params)).fetchone()
                if row is not None:
                    return int(row[0])
                # A live job holds this unique key: return it. If it finished in between,
                # insert again.
                cur = await conn.execute(self.q["live_job_with_key"], {"unique_key": unique_key})
                row = await cur.fetchone()
                if row is not None:
                    return int(row[0])
        except _MEANINGFUL as exc:
            found = _meaning(self, exc, conn)
            if found is None:
                raise
            raise found from exc

    def insert_job_sync(self, conn: SyncConn, job: NewJob, *, unique_key: str | None = None) -> int:
        """`insert_job` on a synchronous connection."""
        query, params = self._insert_one(job, unique_key)
        try:
            while True:
                row = conn.execute(query, params).fetchone()
                if row is not None:
                    return int(row[0])
                cur = conn.execute(self.q["live_job_with_key"], {"unique_key": unique_key})
                row = cur.fetchone()
                if row is not None:
                    return int(row[0])
        except _MEANINGFUL as exc:
            found = _meaning(self, exc, conn)
            if found is None:
                raise
            raise found from exc

    @_translating
    async def insert_jobs(self, conn: Conn, jobs: NewJob) -> list[int]:
        """Write one job per element of ``jobs.args`` (a JSON array), with ``jobs``' other
        fields; ids in the order of the array."""
        if jobs.group_key is None and jobs.trace_context is None:
            cur = await conn.execute(self.q["insert_jobs"], jobs._asdict(), binary=True)
        else:
            query = self.q[
                _ARRAY_INSERTS[jobs.group_key is not None, jobs.trace_context is not None]
            ]
            cur = await conn.execute(query, {**jobs._asdict(), "unique_key": None}, binary=True)
        return list(map(_first, await cur.fetchall()))  # binary: ints as they are

    @_translating
    async def insert_rows(self, conn: Conn, *, rows: Sequence[NewJob]) -> list[int]:
        """Write jobs of any tasks and options in one statement; ids in the order given
        (traced: each with its trace context)."""
        params = {
            "task_names": [r.task_name for r in rows],
            "queues": [r.queue for r in rows],
            "args": [r.args for r in rows],
            "priorities": [r.priority for r in rows],
            "run_ats": [r.run_at for r in rows],
            "delays": [r.delay for r in rows],
            "max_attempts": [r.max_attempts for r in rows],
        }
        if self.traced:
            params["trace_contexts"] = [r.trace_context for r in rows]
        cur = await conn.execute(
            self.q["insert_rows_traced" if self.traced else "insert_rows"], params
        )
        return [int(row[0]) for row in await cur.fetchall()]

    async def claim(
        self,
        conn: Conn,
        *,
        worker: str,
        limit: int,
        queues: Sequence[str] | None,
        lease: timedelta,
        skip: Sequence[str] | None = None,
    ) -> list[Job]:
        """Claim ready jobs (in ``queues``: None, any), none of the tasks in ``skip``."""
        params: dict[str, Any] = {
            "worker": worker,
            "limit": limit,
            "lease": lease,
            "skip": list(skip) if skip else None,
        }
        if queues:
            params["queues"] = list(queues)
            query = self.q["claim_queues"]
        else:
            query = self.q["claim_any"]
        cur = await conn.execute(query, params, binary=True)
        return [_new_job(Job, row) for row in await cur.fetchall()]

    async def claim_writing_done(
        self,
        conn: Conn,
        *,
        worker: str,
        limit: int,
        queues: Sequence[str] | None,
        lease: timedelta,
        done: Sequence[Job],
        skip: Sequence[str] | None = None,
    ) -> tuple[list[Job], int]:
        """`claim`, in the statement that first writes ``done`` done as `mark_done` does
        (with no result to store): the jobs claimed, and how many of ``done`` this worker
        still owned, written done."""
        params = _fence(worker, done)
        params.update(
            limit=limit,
            lease=lease,
            queues=list(queues) if queues else None,
            skip=list(skip) if skip else None,
        )
        cur = await conn.execute(self.q["claim_writing_done"], params, binary=True)
        rows = await cur.fetchall()
        written = int(rows[0][0])
        if rows[0][1] is None:
            return [], written
        return [_new_job(Job, row[1:]) for row in rows], written

    async def claim_aged(
        self,
        conn: Conn,
        *,
        worker: str,
        limit: int,
        queues: Sequence[str] | None,
        lease: timedelta,
        aging: float,
        skip: Sequence[str] | None = None,
    ) -> list[Job]:
        """Claim the ready jobs whose priority, raised one level for every ``aging`` seconds
        they have been due, is above the oldest job of the top priority's (none if no job
        is): at most ``limit``, of a lower priority than that job."""
        params: dict[str, Any] = {
            "worker": worker,
            "limit": limit,
            "lease": lease,
            "aging": aging,
            "queues": list(queues) if queues else None,
            "skip": list(skip) if skip else None,
        }
        async with conn.transaction():
            await conn.execute("SET LOCAL jit = off")
            cur = await conn.execute(self.q["claim_aged"], params)
            return [_new_job(Job, row) for row in await cur.fetchall()]

    async def claim_limited(
        self,
        conn: Conn,
        *,
        worker: str,
        limit: int,
        queues: Sequence[str] | None,
        lease: timedelta,
        limits: ClaimLimits,
        limited: int,
    ) -> list[Job]:
        """Claim within the limits of the limited tasks, at most ``limited`` jobs of them
        (one call: the function takes the limits lock, then claims)."""
        params: dict[str, Any] = {
            "worker": worker,
            "limit": limit,
            "limited": limited,
            "lease": lease,
            "queues": list(queues) if queues else None,
            "scan": GROUP_SCAN,
            **limits.params(),
        }
        query = self.q["claim_limited_traced" if self.traced else "claim_limited"]
        cur = await conn.execute(query, params)
        return [_new_job(Job, row) for row in await cur.fetchall()]

    async def mark_done(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        results: Sequence[str | None] | None = None,
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> set[int]:
        """Mark jobs done with their results (JSON text, or None to store none; no
        ``results``: none), what their tasks logged and their last progress (the same);
        returns the ids this worker still owned."""
        if _any(logs) or _any(progress):
            params = _fence(
                worker,
                jobs,
                results=results or [None] * len(jobs),
                logs=logs or [None] * len(jobs),
                progress=progress or [None] * len(jobs),
            )
            query = self.q["mark_done_with"]
        elif results is None or all(r is None for r in results):
            params = _fence(worker, jobs)
            query = self.q["mark_done"]
        else:
            params = _fence(worker, jobs, results=results)
            query = self.q["mark_done_results"]
        cur = await conn.execute(query, params)
        return {int(r[0]) for r in await cur.fetchall()}

    async def write_progress(
        self, conn: Conn, *, worker: str, jobs: Sequence[Job], progress: Sequence[str]
    ) -> set[int]:
        """Write what running jobs reported last; returns the ids this worker still owned."""
        cur = await conn.execute(self.q["write_progress"], _fence(worker, jobs, progress=progress))
        return {int(r[0]) for r in await cur.fetchall()}

    async def written_by_claims(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        kinds: Sequence[str],
        errors: Sequence[str | None],
    ) -> dict[int, str]:
        """Of ``jobs``, whose outcomes (``kinds``: done, failed, snoozed, cancelled or
        released; a failed one's stored ``errors``) the fence refused, those this worker
        wrote already at the claim it holds them by; the status each was left in."""
        attempts = [j.attempt for j in jobs]
        params = _fence(worker, jobs, kinds=kinds, errors=errors, attempts=attempts)
        cur = await conn.execute(self.q["written_by_claims"], params)
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def mark_failed(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        retry_in: Sequence[float],
        errors: Sequence[str],
        give_up: Sequence[bool],
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> dict[int, str]:
        """Record failed attempts (each with what its task logged and its last progress,
        JSON text or None, in the job's history); returns the new status of each job this
        worker still owned."""
        params = _ended(
            worker, jobs, logs, progress, retry_in=retry_in, errors=errors, give_up=give_up
        )
        cur = await conn.execute(self.q["mark_failed"], params)
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def give_back(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        errors: Sequence[str],
        delay: float,
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> dict[int, str]:
        """Give back jobs whose task this worker does not know, the attempt not counted."""
        params = _ended(worker, jobs, logs, progress, errors=errors)
        params["delay"] = delay
        cur = await conn.execute(self.q["give_back"], params)
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def fail_unknown(self, conn: Conn, *, grace: timedelta, limit: int) -> list[int]:
        cur = await conn.execute(self.q["fail_unknown"], {"grace": grace, "limit": limit})
        return [int(r[0]) for r in await cur.fetchall()]

    async def mark_snoozed(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        after: Sequence[float],
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> dict[int, str]:
        params = _ended(worker, jobs, logs, progress, after=after)
        cur = await conn.execute(self.q["mark_snoozed"], params)
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def release(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        free_handbacks: int,
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> dict[int, str]:
        """Hand jobs back at shutdown; returns the new status of each job still owned."""
        params = _ended(worker, jobs, logs, progress)
        params["free"] = free_handbacks
        cur = await conn.execute(self.q["release"], params)
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def mark_cancelled(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        logs: Sequence[str | None] | None = None,
        progress: Sequence[str | None] | None = None,
    ) -> dict[int, str]:
        """End attempts a cancel stopped; returns the new status of each job still owned."""
        cur = await conn.execute(self.q["mark_cancelled"], _ended(worker, jobs, logs, progress))
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    async def heartbeat(self, conn: Conn, *, worker: str, jobs: Sequence[Job]) -> dict[int, bool]:
        """Renew leases; returns the ids whose lease this worker still holds, each with
        whether a cancel asked to stop it."""
        cur = await conn.execute(self.q["heartbeat"], _fence(worker, jobs))
        return {int(r[0]): bool(r[1]) for r in await cur.fetchall()}

    async def aborts_requested(self, conn: Conn, *, worker: str, jobs: Sequence[Job]) -> set[int]:
        """The ids of these jobs, still this worker's by the same claim, that a cancel
        asked to stop."""
        cur = await conn.execute(self.q["aborts_requested"], _fence(worker, jobs))
        return {int(r[0]) for r in await cur.fetchall()}

    @_translating
    async def cancel(self, conn: Conn, *, ids: Sequence[int]) -> dict[int, str]:
        """Cancel jobs; returns what happened to each job found (cancelled, aborting, or
        the status it had)."""
        cur = await conn.execute(self.q["cancel"], {"ids": list(ids)})
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    @_translating
    async def pause_queue(self, conn: Conn, *, queue: str) -> bool:
        """Pause ``queue``; False if it was paused already."""
        row = await (await conn.execute(self.q["pause_queue"], {"queue": queue})).fetchone()
        return bool(row and row[0])

    @_translating
    async def resume_queue(self, conn: Conn, *, queue: str) -> bool:
        """Resume ``queue``; False if it was not paused."""
        row = await (await conn.execute(self.q["resume_queue"], {"queue": queue})).fetchone()
        return bool(row and row[0])

    async def paused_queues(self, conn: Conn) -> dict[str, datetime]:
        cur = await conn.execute(self.q["paused_queues"])
        return {str(r[0]): r[1] for r in await cur.fetchall()}

    @_translating
    async def set_limits(self, conn: Conn, *, override: Override) -> None:
        """Write ``override`` over the one there is, and tell every worker."""
        rate = override.rate
        params = {
            "kind": override.kind,
            "name": override.name,
            "concurrency": override.concurrency,
            "rate": rate.count if rate else None,
            "period": rate.period if rate else None,
            "group_concurrency": override.group_concurrency,
        }
        await conn.execute(self.q["set_limits"], params)

    @_translating
    async def reset_limits(self, conn: Conn, *, kind: str, name: str) -> bool:
        """Drop the overrides of a task or queue, and tell every worker; False if it had none."""
        cur = await conn.execute(self.q["reset_limits"], {"kind": kind, "name": name})
        row = await cur.fetchone()
        return bool(row and row[0])

    async def fair_tasks(self, conn: Conn) -> list[str]:
        """The tasks whose jobs have been deferred in groups (claimed by turns)."""
        cur = await conn.execute(self.q["fair_tasks"])
        return [str(r[0]) for r in await cur.fetchall()]

    @_translating
    async def list_limits(self, conn: Conn) -> list[Override]:
        """Every override kept in the database."""
        cur = await conn.execute(self.q["list_limits"])
        return [Override.from_row(tuple(r)) for r in await cur.fetchall()]

    async def at_work(self, conn: Conn, *, pid: int, application_name: str | None) -> bool:
        """Whether the server is at work on a statement of the session ``pid`` (behind a
        pooler: of any session named ``application_name``), asked on another ``conn``."""
        params = {
            "own_pid": conn.info.backend_pid,
            "pid": pid,
            "application_name": application_name,
        }
        row = await (await conn.execute(self.q["at_work"], params)).fetchone()
        return bool(row and row[0])

    async def try_lock(self, conn: Conn, *, name: str, schema: str) -> bool:
        """Take the transaction's advisory lock on ``name`` for ``schema``; False if another
        session holds it. Call inside a transaction, first: the lock ends with it, and the
        transaction's idle time is bounded as by `limit_idle`."""
        params = {"name": name, "schema": schema, "idle": IDLE_LIMIT}
        row = await (await conn.execute(self.q["try_lock"], params)).fetchone()
        return bool(row and row[0])

    async def limit_idle(self, conn: Conn) -> None:
        """Bound how long the transaction begun on ``conn`` may sit idle (its worker
        frozen) before the server ends it: the first statement of a worker's transaction."""
        await conn.execute(self.q["limit_idle"], {"idle": IDLE_LIMIT})

    async def reap_expired(self, conn: Conn, *, limit: int) -> dict[int, str]:
        """Return jobs with expired leases to the queue (or to failed)."""
        cur = await conn.execute(self.q["reap_expired"], {"limit": limit})
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    @_translating
    async def prune_done(self, conn: Conn, *, retention: timedelta, limit: int) -> int:
        cur = await conn.execute(self.q["prune_done"], {"retention": retention, "limit": limit})
        row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def worker_facts(self, conn: Conn) -> WorkerFacts | None:
        """Where the jobs table is, and the server's encoding; None when there is no jobs
        table."""
        cur = await conn.execute(self.q["worker_facts"], {"schema": self.schema})
        row = await cur.fetchone()
        return None if row is None else WorkerFacts(*row)

    async def has_ready_by_task(self, conn: Conn, schema: str) -> bool:
        """Whether ``schema`` has the index the claim of limited tasks reads."""
        row = await (await conn.execute(self.q["has_ready_by_task"], {"schema": schema})).fetchone()
        return bool(row and row[0])

    async def channel(self, conn: Conn) -> str:
        """The wake-up channel of the jobs table's schema."""
        row = await (await conn.execute(self.q["channel"])).fetchone()
        assert row is not None
        return str(row[0])

    async def next_due(self, conn: Conn, *, queues: Sequence[str] | None) -> float | None:
        """Seconds until the earliest queued job that is not ready yet comes due."""
        params = {"queues": list(queues) if queues else None}
        row = await (await conn.execute(self.q["next_due"], params)).fetchone()
        return None if row is None or row[0] is None else row[0] / 1000

    async def missing_worker_privileges(self, conn: Conn, schema: str) -> list[str]:
        """What the connected role lacks to run a worker on ``schema``'s jobs table."""
        table, migrations, queues, listeners, steps, waits, events = (
            sql.Identifier(schema, name).as_string(conn)
            for name in (
                "asyncq_jobs",
                "asyncq_migrations",
                "asyncq_queues",
                "asyncq_result_listeners",
                "asyncq_steps",
                "asyncq_waits",
                "asyncq_events",
            )
        )
        cur = await conn.execute(
            self.q["missing_worker_privileges"],
            {
                "table": table,
                "migrations": migrations,
                "queues": queues,
                "listeners": listeners,
                "steps": steps,
                "waits": waits,
                "events": events,
            },
        )
        return [str(row[0]) for row in await cur.fetchall()]

    async def missing_scheduler_privileges(self, conn: Conn, schema: str) -> list[str]:
        """What the connected role lacks to fire schedules on ``schema``'s tables."""
        table, schedules, runs = (
            sql.Identifier(schema, name).as_string(conn)
            for name in ("asyncq_jobs", "asyncq_schedules", "asyncq_schedule_runs")
        )
        cur = await conn.execute(
            self.q["missing_scheduler_privileges"],
            {"table": table, "schedules": schedules, "runs": runs},
        )
        return [str(row[0]) for row in await cur.fetchall()]

    @_translating
    async def requeue_ids(self, conn: Conn, *, ids: Sequence[int]) -> list[int]:
        return await self._requeue(conn, self.q["requeue_ids"], {"ids": list(ids)})

    @_translating
    async def requeue_failed(
        self, conn: Conn, *, queues: Sequence[str] | None, tasks: Sequence[str] | None
    ) -> list[int]:
        return await self._requeue(
            conn,
            self.q["requeue_failed"],
            {"queues": list(queues) if queues else None, "tasks": list(tasks) if tasks else None},
        )

    async def _requeue(self, conn: Conn, query: str, params: dict[str, Any]) -> list[int]:
        tries = 0
        while True:
            tries += 1
            try:
                cur = await conn.execute(query, params)
                return sorted(int(r[0]) for r in await cur.fetchall())
            except errors.UniqueViolation:
                # Another session requeued a job with the same unique key at the same time.
                # It has committed now: run again, and this statement sees that live job.
                if tries >= REQUEUE_TRIES:
                    raise

    @_translating
    async def job_endings(self, conn: Conn, *, ids: Sequence[int]) -> list[JobEnding]:
        """The status of each of these jobs that exists, with its result (done) or its
        last error (failed, cancelled)."""
        cur = await conn.execute(self.q["job_endings"], {"ids": _bigint_array(list(ids))})
        return [JobEnding._make(row) for row in await cur.fetchall()]

    @_translating
    async def results_listening(self, conn: Conn, *, listener: str) -> None:
        await conn.execute(self.q["results_listening"], {"listener": listener})

    async def results_not_listening(self, conn: Conn, *, listener: str) -> None:
        await conn.execute(self.q["results_not_listening"], {"listener": listener})

    @_translating
    async def results_channel(self, conn: Conn) -> str:
        """The channel of news of finished jobs in the jobs table's schema."""
        row = await (await conn.execute(self.q["results_channel"])).fetchone()
        assert row is not None
        return str(row[0])

    @_translating
    async def job_statuses(self, conn: Conn, *, ids: Sequence[int]) -> dict[int, str]:
        cur = await conn.execute(self.q["job_statuses"], {"ids": list(ids)})
        return {int(r[0]): str(r[1]) for r in await cur.fetchall()}

    # -- what people look at (the asyncq command, the dashboard) -----------------------

    def _table(self, conn: Conn) -> str:
        name = ("asyncq_jobs",) if self.schema is None else (self.schema, "asyncq_jobs")
        return sql.Identifier(*name).as_string(conn)

    @_translating
    async def list_jobs(
        self,
        conn: Conn,
        *,
        status: str | None,
        queue: str | None,
        task: str | None,
        limit: int,
        before_id: int | None = None,
    ) -> list[tuple[Any, ...]]:
        params = {
            "status": status,
            "queue": queue,
            "task": task,
            "limit": limit,
            "before_id": before_id,
        }
        query = self.q[f"list_{_LISTINGS[status]}"]
        return await (await conn.execute(query, params)).fetchall()

    @_translating
    async def count_jobs(
        self,
        conn: Conn,
        *,
        status: str | None,
        queue: str | None,
        task: str | None,
        at_most: int,
        before_id: int | None = None,
    ) -> int:
        """How many jobs `list_jobs` would give without its limit, counted up to
        ``at_most``."""
        params = {
            "status": status,
            "queue": queue,
            "task": task,
            "at_most": at_most,
            "before_id": before_id,
        }
        query = self.q[f"count_{_LISTINGS[status]}"]
        row = await (await conn.execute(query, params)).fetchone()
        assert row is not None
        return int(row[0])

    # The search's statements are planned for the filters each call gives (never prepared:
    # a generic plan of "x IS NULL OR col = x" could use none of the partial indexes by
    # state), so that a filter by state or queue reads through its index.

    @_translating
    async def search_jobs(
        self, conn: Conn, where: dict[str, Any], *, limit: int, offset: int
    ) -> list[tuple[Any, ...]]:
        params = {**where, "limit": limit, "offset": offset}
        cur = await conn.execute(self.q["search_jobs"], params, prepare=False)
        return await cur.fetchall()

    @_translating
    async def count_matching(
        self, conn: Conn, where: dict[str, Any], *, eligible: list[str] | None, at_most: int
    ) -> tuple[int, int]:
        params = {**where, "eligible": eligible, "at_most": at_most}
        cur = await conn.execute(self.q["count_matching"], params, prepare=False)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    @_translating
    async def newest_id(self, conn: Conn) -> int:
        row = await (await conn.execute(self.q["newest_id"])).fetchone()
        assert row is not None
        return int(row[0])

    @_translating
    async def bulk_batch(
        self, conn: Conn, where: dict[str, Any], *, eligible: list[str], after: int, batch: int
    ) -> list[int]:
        params = {**where, "eligible": eligible, "after": after, "batch": batch}
        cur = await conn.execute(self.q["bulk_batch"], params, prepare=False)
        return [int(r[0]) for r in await cur.fetchall()]

    @_translating
    async def bulk_change(
        self,
        conn: Conn,
        action: str,
        *,
        ids: Sequence[int],
        priority: int | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete, reprioritize or move these jobs (``action``: ``delete``, ``priority``,
        ``move``); returns how many changed."""
        params = {"ids": list(ids), "priority": priority, "queue_to": queue}
        cur = await conn.execute(self.q[f"bulk_{action}"], params)
        return len(await cur.fetchall())

    @_translating
    async def audit_start(
        self,
        conn: Conn,
        *,
        actor: str,
        action: str,
        filter: str,
        detail: str | None,
        matched: int,
    ) -> int:
        params = {
            "actor": actor,
            "action": action,
            "filter": filter,
            "detail": detail,
            "matched": matched,
        }
        row = await (await conn.execute(self.q["audit_start"], params)).fetchone()
        assert row is not None
        return int(row[0])

    @_translating
    async def audit_progress(self, conn: Conn, *, audit_id: int, rows: int) -> None:
        await conn.execute(self.q["audit_progress"], {"id": audit_id, "rows": rows})

    @_translating
    async def audit_heartbeat(self, conn: Conn, *, audit_id: int) -> None:
        await conn.execute(self.q["audit_heartbeat"], {"id": audit_id})

    @_translating
    async def audit_end(
        self, conn: Conn, *, audit_id: int, state: str, error: str | None = None
    ) -> None:
        params = {"id": audit_id, "state": state, "error": error}
        await conn.execute(self.q["audit_end"], params)

    @_translating
    async def audit_list(
        self, conn: Conn, *, limit: int, stale: timedelta
    ) -> list[tuple[Any, ...]]:
        params = {"limit": limit, "stale": stale}
        return await (await conn.execute(self.q["audit_list"], params)).fetchall()

    @_translating
    async def job_detail(self, conn: Conn, *, job_id: int) -> tuple[Any, ...] | None:
        return await (await conn.execute(self.q["job_detail"], {"id": job_id})).fetchone()

    def job_detail_sync(self, conn: SyncConn, *, job_id: int) -> tuple[Any, ...] | None:
        """`job_detail` on a synchronous connection."""
        try:
            return conn.execute(self.q["job_detail"], {"id": job_id}).fetchone()
        except _MEANINGFUL as exc:
            found = _meaning(self, exc, conn)
            if found is None:
                raise
            raise found from exc

    @_translating
    async def queue_overview(self, conn: Conn) -> list[tuple[Any, ...]]:
        return await (await conn.execute(self.q["queue_overview"])).fetchall()

    @_translating
    async def state_counts(self, conn: Conn) -> tuple[int, ...]:
        row = await (await conn.execute(self.q["state_counts"])).fetchone()
        assert row is not None
        return tuple(int(n) for n in row)

    @_translating
    async def table_health(self, conn: Conn) -> tuple[Any, ...] | None:
        table = self._table(conn)
        return await (await conn.execute(self.q["table_health"], {"table": table})).fetchone()

    @_translating
    async def autovacuum_off(self, conn: Conn) -> tuple[bool, list[str]]:
        """Whether the server runs autovacuum, and asyncq's tables it skips by their own
        setting (``autovacuum_enabled = false``)."""
        table = self._table(conn)
        row = await (await conn.execute(self.q["autovacuum_off"], {"table": table})).fetchone()
        assert row is not None
        return bool(row[0]), [str(name) for name in row[1]]

    @_translating
    async def index_sizes(self, conn: Conn) -> list[tuple[Any, ...]]:
        table = self._table(conn)
        return await (await conn.execute(self.q["index_sizes"], {"table": table})).fetchall()

    @_translating
    async def oldest_snapshot(self, conn: Conn) -> tuple[Any, ...] | None:
        return await (await conn.execute(self.q["oldest_snapshot"], {})).fetchone()

    @_translating
    async def throughput(self, conn: Conn, *, minutes: int) -> list[tuple[Any, ...]]:
        return await (await conn.execute(self.q["throughput"], {"minutes": minutes})).fetchall()

    @_translating
    async def queue_history(self, conn: Conn, *, minutes: int) -> list[tuple[Any, ...]]:
        return await (await conn.execute(self.q["queue_history"], {"minutes": minutes})).fetchall()

    @_translating
    async def queue_samples(self, conn: Conn, *, minutes: int) -> list[tuple[Any, ...]]:
        return await (await conn.execute(self.q["queue_samples"], {"minutes": minutes})).fetchall()

    @_translating
    async def write_queue_samples(
        self, conn: Conn, *, queues: list[str], depth: list[int], running: list[int]
    ) -> None:
        params = {"queues": queues, "depth": depth, "running": running}
        await conn.execute(self.q["write_queue_samples"], params)

    @_translating
    async def prune_queue_samples(self, conn: Conn, *, retention: timedelta) -> int:
        cur = await conn.execute(self.q["prune_queue_samples"], {"retention": retention})
        return cur.rowcount

    @_translating
    async def read_snapshot(self, conn: Conn) -> None:
        await conn.execute(self.q["read_snapshot"])

    @_translating
    async def database_clock(self, conn: Conn) -> datetime:
        row = await (await conn.execute(self.q["database_clock"])).fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    async def declare_schedules(
        self, conn: Conn, *, schedules: Sequence[Schedule], now: datetime
    ) -> dict[str, datetime]:
        """Write the schedules as declared (a new one starts after its latest slot at
        ``now``); returns the last slot of each, as the table holds it."""
        ordered = sorted(schedules, key=lambda s: s.name)  # rows locked in one order
        names = [s.name for s in ordered]
        await conn.execute(
            self.q["declare_schedules"],
            {
                "names": names,
                "task_names": [s.task_name for s in ordered],
                "crons": [s.cron.expression for s in ordered],
                "tzs": [s.tz for s in ordered],
                "kwargs": [s.args for s in ordered],
                "queues": [s.queue for s in ordered],
                "last_slots": [s.cron.latest(now) for s in ordered],
            },
        )
        cur = await conn.execute(self.q["schedule_slots"], {"names": names})
        return {str(r[0]): r[1] for r in await cur.fetchall()}

    async def fire_schedules(
        self, conn: Conn, *, due: Sequence[tuple[Schedule, datetime]]
    ) -> list[FireResult]:
        """Fire each schedule's slot unless it is fired already (or not due by the
        database's clock, or declared otherwise in the table)."""
        ordered = sorted(due, key=lambda d: d[0].name)
        cur = await conn.execute(
            self.q["fire_schedules"],
            {
                "names": [s.name for s, _ in ordered],
                "slots": [slot for _, slot in ordered],
                "crons": [s.cron.expression for s, _ in ordered],
                "tzs": [s.tz for s, _ in ordered],
                "priorities": [s.priority for s, _ in ordered],
                "max_attempts": [s.max_attempts for s, _ in ordered],
            },
        )
        return [
            FireResult(str(r[0]), None if r[1] is None else int(r[1]), bool(r[2]))
            for r in await cur.fetchall()
        ]

    @_translating
    async def list_schedules(self, conn: Conn) -> list[ScheduleRow]:
        cur = await conn.execute(self.q["list_schedules"])
        return [ScheduleRow._make(row) for row in await cur.fetchall()]

    # -- work that spans jobs (asyncq.workflow) ------------------------------------------

    async def write_steps(
        self,
        conn: Conn,
        *,
        worker: str,
        jobs: Sequence[Job],
        names: Sequence[str],
        seqs: Sequence[int],
        results: Sequence[str],
        started: Sequence[datetime],
    ) -> list[tuple[int, str, int, str, str | None]]:
        """Record steps of running jobs (one per element of ``jobs``, which may repeat):
        (job id, name, seq, 'written' | 'exists' | 'lost', the result stored before)."""
        attempts = [j.attempt for j in jobs]
        params = _fence(
            worker,
            jobs,
            names=names,
            seqs=seqs,
            results=results,
            attempts=attempts,
            started=started,
        )
        # Arrays in their text form, made here: psycopg dumps a list one element at a time
        # (about 6 us a step, more than the rest of the step's checkpoint).
        params.update(
            names=_text_array(params["names"]),
            seqs=_bigint_array(params["seqs"]),
            results=_text_array(params["results"]),
            attempts=_bigint_array(params["attempts"]),
            started=_timestamptz_array(params["started"]),
        )
        cur = await conn.execute(self.q["write_steps"], params)
        return [(int(r[0]), str(r[1]), int(r[2]), str(r[3]), r[4]) for r in await cur.fetchall()]

    async def write_step_in_transaction(
        self,
        conn: Conn,
        *,
        worker: str,
        job: Job,
        name: str,
        seq: int,
        result: str,
        started: datetime,
    ) -> tuple[str, str | None]:
        params = {
            "worker": worker,
            "id": job.id,
            "claim": job.claim,
            "name": name,
            "seq": seq,
            "result": result,
            "attempt": job.attempt,
            "started": started,
        }
        row = await (await conn.execute(self.q["write_step_in_transaction"], params)).fetchone()
        assert row is not None
        return str(row[0]), row[1]

    async def job_steps(self, conn: Conn, *, job_id: int) -> dict[tuple[str, int], str | None]:
        cur = await conn.execute(self.q["job_steps"], {"id": job_id})
        return {(str(r[0]), int(r[1])): r[2] for r in await cur.fetchall()}

    async def suspend(
        self,
        conn: Conn,
        *,
        worker: str,
        job: Job,
        kind: str,
        until: datetime | None,
        seconds: float | None,
        key: str | None,
        awaited: Sequence[int],
        step: str | None,
        seq: int,
    ) -> tuple[str, str | None, datetime | None]:
        params = {
            "worker": worker,
            "id": job.id,
            "claim": job.claim,
            "kind": kind,
            "until": until,
            "seconds": seconds,
            "key": key,
            "awaited": _bigint_array(sorted(awaited)) if awaited else None,
            "step": step,
            "seq": seq,
            "attempt": job.attempt,
        }
        row = await (await conn.execute(self.q["suspend"], params)).fetchone()
        assert row is not None
        return str(row[0]), row[1], row[2]

    async def spawn(
        self,
        conn: Conn,
        *,
        worker: str,
        job: Job,
        step: str,
        seq: int,
        task_name: str,
        queue: str,
        args: str,
        priority: int,
        max_attempts: int,
    ) -> list[int] | None:
        params = {
            "worker": worker,
            "id": job.id,
            "claim": job.claim,
            "attempt": job.attempt,
            "step": step,
            "seq": seq,
            "task_name": task_name,
            "queue": queue,
            "args": args,
            "priority": priority,
            "max_attempts": max_attempts,
        }
        row = await (await conn.execute(self.q["spawn"], params)).fetchone()
        return None if row is None or row[0] is None else [int(i) for i in row[0]]

    @_translating
    async def emit_event(self, conn: Conn, *, key: str, payload: str) -> bool:
        row = await (
            await conn.execute(self.q["emit_event"], {"key": key, "payload": payload})
        ).fetchone()
        return bool(row and row[0])

    def emit_event_sync(self, conn: SyncConn, *, key: str, payload: str) -> bool:
        row = conn.execute(self.q["emit_event"], {"key": key, "payload": payload}).fetchone()
        return bool(row and row[0])

    async def wake_due(self, conn: Conn, *, limit: int) -> int:
        row = await (await conn.execute(self.q["wake_due"], {"limit": limit})).fetchone()
        return int(row[0]) if row else 0

    async def next_wake(self, conn: Conn) -> float | None:
        row = await (await conn.execute(self.q["next_wake"])).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    async def wake_lost(self, conn: Conn, *, limit: int) -> list[int]:
        cur = await conn.execute(self.q["wake_lost"], {"limit": limit})
        return [int(r[0]) for r in await cur.fetchall()]

    async def defer_after(
        self, conn: Conn, *, jobs: NewJob, after: Sequence[int], failure: str
    ) -> list[int]:
        """One job per element of ``jobs.args`` (a JSON array), to run after ``after``."""
        params = {
            "task_name": jobs.task_name,
            "queue": jobs.queue,
            "args": jobs.args,
            "priority": jobs.priority,
            "max_attempts": jobs.max_attempts,
            "after": _bigint_array(list(after)),
            "failure": failure,
        }
        cur = await conn.execute(self.q["defer_after"], params)
        return [int(r[0]) for r in await cur.fetchall()]

    @_translating
    async def retry(
        self, conn: Conn, *, job_id: int, from_step: str | None
    ) -> tuple[str | None, int]:
        """Run an ended job again (from ``from_step``): the status it had (None: no such
        job; 'no step': it has no step of that name), and how many steps it forgot."""
        params = {"id": job_id, "from_step": from_step}
        row = await (await conn.execute(self.q["retry"], params)).fetchone()
        assert row is not None
        return row[0], int(row[1])

    async def prune_events(self, conn: Conn, *, retention: timedelta, limit: int) -> int:
        params = {"retention": retention, "limit": limit}
        row = await (await conn.execute(self.q["prune_events"], params)).fetchone()
        return int(row[0]) if row else 0

    @_translating
    async def job_workflow(self, conn: Conn, *, job_id: int, limit: int) -> tuple[Any, ...] | None:
        """A job's steps, children, dependencies and waits (``limit``: of each list, at
        most so many), as `admin.job` shows them."""
        cur = await conn.execute(self.q["job_workflow"], {"id": job_id, "limit": limit})
        return await cur.fetchone()

    # -- workers (asyncq_workers) -------------------------------------------------------

    async def worker_started(self, conn: Conn, *, row: WorkerRow) -> datetime:
        """Write ``row``; returns when the worker started, by the database's clock."""
        cur = await conn.execute(self.q["worker_started"], row._asdict())
        found = await cur.fetchone()
        assert found is not None
        return found[0]  # type: ignore[no-any-return]

    async def worker_seen(
        self, conn: Conn, *, row: WorkerRow, running: int, started: datetime | None
    ) -> tuple[int, int]:
        """Refresh ``row`` (write it again if it is gone) with the jobs it runs now;
        returns how many workers are live and how many dead."""
        params = {**row._asdict(), "running": running, "started": started}
        found = await (await conn.execute(self.q["worker_seen"], params)).fetchone()
        assert found is not None
        return int(found[0]), int(found[1])

    async def worker_stopped(self, conn: Conn, *, worker: str) -> None:
        await conn.execute(self.q["worker_stopped"], {"id": worker})

    @_translating
    async def list_workers(self, conn: Conn) -> list[tuple[Any, ...]]:
        return await (await conn.execute(self.q["list_workers"])).fetchall()

    async def prune_workers(self, conn: Conn, *, after: timedelta) -> int:
        """Delete the rows of workers not seen for ``after``; returns how many."""
        cur = await conn.execute(self.q["prune_workers"], {"after": after})
        return cur.rowcount

    # -- asyncq.testing ----------------------------------------------------------------

    async def testing_advance(
        self, conn: Conn, *, scheduled: bool, timeouts: bool, queues: Sequence[str] | None
    ) -> list[int]:
        """Make the jobs waiting for a retry or a snooze (with ``scheduled``, every queued
        job) due now, and end the sleeps (with ``timeouts``, the waits for events that
        have a timeout) of the waiting jobs; returns their ids."""
        params = {
            "scheduled": scheduled,
            "timeouts": timeouts,
            "queues": None if queues is None else list(queues),
        }
        cur = await conn.execute(self.q["testing_advance"], params)
        return [int(row[0]) for row in await cur.fetchall()]

    async def testing_left_ready(
        self, conn: Conn, *, queues: Sequence[str] | None
    ) -> list[tuple[int, str, bool]]:
        """The jobs ready now and still queued: (id, queue, whether the queue is paused)."""
        cur = await conn.execute(
            self.q["testing_left_ready"], {"queues": None if queues is None else list(queues)}
        )
        return [(int(row[0]), str(row[1]), bool(row[2])) for row in await cur.fetchall()]

    async def testing_waiting(
        self, conn: Conn, *, queues: Sequence[str] | None
    ) -> list[tuple[int, str, str, datetime | None, list[int]]]:
        """The waiting jobs: (id, task name, what for, due at, the jobs it waits for)."""
        cur = await conn.execute(
            self.q["testing_waiting"], {"queues": None if queues is None else list(queues)}
        )
        return [
            (int(row[0]), str(row[1]), str(row[2]), row[3], [int(i) for i in row[4]])
            for row in await cur.fetchall()
        ]

    async def testing_jobs_of_task(self, conn: Conn, *, task: str) -> list[tuple[Any, ...]]:
        cur = await conn.execute(self.q["testing_jobs_of_task"], {"task": task})
        return await cur.fetchall()

    async def testing_empty(self, conn: Conn) -> None:
        """Delete every row of the schema's tables but its migrations' (a DELETE of the
        few rows a test leaves costs a millisecond, a TRUNCATE of six tables ~70)."""
        await conn.execute(self.q["testing_empty"], prepare=False)


# -- the embedded server -------------------------------------------------------------


def create_database_sync(conn: SyncConn, name: str) -> bool:
    """Make the database ``name`` on ``conn``'s server (autocommit) unless it is there;
    True if this call made it. Another process that makes it at the same moment wins."""
    row = conn.execute(QUERIES["database_exists"], {"name": name}).fetchone()
    if row and row[0]:
        return False
    statement = sql.SQL(QUERIES["create_database"]).format(name=sql.Identifier(name))
    try:
        conn.execute(statement)
    except (errors.DuplicateDatabase, errors.UniqueViolation):
        return False  # made by another process since
    return True
