"""What people do with jobs, queues and schedules (the ``asyncq`` command, the App's
methods, the dashboard): look at jobs, queues, schedules and the table's health;
requeue, cancel, pause, resume and prune. Each takes a connection and the App's store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg import errors
from psycopg.pq import TransactionStatus

from asyncq.codec import validate_name
from asyncq.display import age
from asyncq.display import since as since_then
from asyncq.errors import JobNotFound
from asyncq.job import PRIORITY_AGING, Status
from asyncq.limits import SOURCE_NAMES, Override, TaskLimits, with_overrides
from asyncq.schedule import Cron, Schedule
from asyncq.store import Conn, Store, SyncConn
from asyncq.workflow import SLEEP, WAIT

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class RequeueResult:
    """What `App.requeue` did: the ids put back in the queue, and why others were not."""

    requeued: list[int]
    refused: dict[int, str]


def refusal(status: str | None) -> str:
    """Why a job in ``status`` (None: no such job) cannot be requeued."""
    if status is None:
        return "no such job"
    if status in (Status.FAILED, Status.CANCELLED):
        return f"{status}, but a live job holds its unique key"
    if status == Status.QUEUED:
        return "already queued"
    return f"{status}: only failed or cancelled jobs can be requeued"


async def requeue(
    conn: Conn,
    store: Store,
    ids: Sequence[int] | None = None,
    *,
    queues: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
) -> RequeueResult:
    """Put failed (or cancelled) jobs back in the queue with fresh attempts: by ``ids``,
    or every failed job, narrowed to ``queues`` and ``tasks`` when given."""
    if ids is not None and (queues or tasks):
        raise ValueError("requeue by ids, or by queues/tasks, not both")
    if ids is None:
        requeued = await store.requeue_failed(conn, queues=queues, tasks=tasks)
        return RequeueResult(requeued=requeued, refused={})
    wanted = sorted({int(i) for i in ids})
    requeued = await store.requeue_ids(conn, ids=wanted)
    others = [i for i in wanted if i not in set(requeued)]
    statuses = await store.job_statuses(conn, ids=others) if others else {}
    return RequeueResult(requeued=requeued, refused={i: refusal(statuses.get(i)) for i in others})


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleInfo:
    """A schedule as `App.list_schedules` shows it. ``declared``: this App declares it
    (a schedule only in the table was declared by another App or an older version);
    ``last_slot`` is None until a worker has declared it; ``next_slot`` comes from the
    table's cron (the App's before any worker declared it)."""

    name: str
    task_name: str
    cron: str
    tz: str
    queue: str | None
    next_slot: datetime | None
    last_slot: datetime | None
    last_job_id: int | None
    last_job_status: str | None
    declared: bool


async def schedules(conn: Conn, store: Store, declared: Iterable[Schedule]) -> list[ScheduleInfo]:
    """Every schedule the App declares or the table holds, by name."""
    ours = {s.name: s for s in declared}
    rows = await store.list_schedules(conn)
    now = rows[0].now if rows else await store.database_clock(conn)
    found: dict[str, ScheduleInfo] = {}
    for row in rows:
        try:
            next_slot: datetime | None = Cron(row.cron, row.tz).next_after(max(now, row.last_slot))
        except (TypeError, ValueError):
            next_slot = None
        found[row.name] = ScheduleInfo(
            name=row.name,
            task_name=row.task_name,
            cron=row.cron,
            tz=row.tz,
            queue=row.queue,
            next_slot=next_slot,
            last_slot=row.last_slot,
            last_job_id=row.last_job_id,
            last_job_status=row.last_job_status,
            declared=row.name in ours,
        )
    for name, schedule in ours.items():
        if name not in found:
            found[name] = ScheduleInfo(
                name=name,
                task_name=schedule.task_name,
                cron=schedule.cron.expression,
                tz=schedule.tz,
                queue=schedule.queue,
                next_slot=schedule.cron.next_after(now),
                last_slot=None,
                last_job_id=None,
                last_job_status=None,
                declared=True,
            )
    return [found[name] for name in sorted(found)]


NOT_FOUND = "not found"


def job_ids(ids: Sequence[object]) -> list[int]:
    """``ids`` as job ids, or a `TypeError`/`ValueError` that names the bad one."""
    wanted = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"a job id is an int, not {i!r}")
        if not 0 < i < 2**63:
            raise ValueError(f"no job has the id {i}")
        wanted.append(i)
    return wanted


CANCEL_TRIES = 5


async def cancel(conn: Conn, store: Store, ids: Sequence[int]) -> dict[int, str]:
    """Cancel jobs: what happened to each, in the order given: ``cancelled`` (it was
    queued), ``aborting`` (it runs: its worker stops it and writes it cancelled), else
    why not: its status (``done``, ``failed``, ``cancelled``) or ``not found``."""
    wanted = list(dict.fromkeys(job_ids(ids)))
    found = await _cancel(conn, store, wanted) if wanted else {}
    return {i: found.get(i, NOT_FOUND) for i in wanted}


async def _cancel(conn: Conn, store: Store, ids: list[int]) -> dict[int, str]:
    tries = 1
    while True:
        try:
            return await store.cancel(conn, ids=ids)
        except errors.DeadlockDetected:
            # The cancel locks its jobs in id order, and so do the workers' writes; a
            # transaction that locks them its own way can still meet it in a cycle, and
            # one of the two loses. The statement rolled back whole: try it again, but
            # not inside a caller's transaction, which the error has ended.
            if tries == CANCEL_TRIES or conn.info.transaction_status != TransactionStatus.IDLE:
                raise
            tries += 1


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryResult:
    """What `retry` did: the status the job had, and how many of its recorded steps it
    forgot (with ``from_step``: that step and every one recorded after it)."""

    was: str
    steps_forgotten: int


async def retry(
    conn: Conn, store: Store, job_id: int, *, from_step: str | None = None
) -> RetryResult:
    """Run an ended job again, from ``from_step`` if given. `JobNotFound` for an unknown
    id; `ValueError` for a job that has not ended, that has no step of that name, or
    whose unique key a live job holds."""
    [wanted] = job_ids([job_id])
    if from_step is not None and (not isinstance(from_step, str) or not from_step):
        raise ValueError(f"from_step must be a step's name, not {from_step!r}")
    try:
        was, forgotten = await store.retry(conn, job_id=wanted, from_step=from_step)
    except errors.UniqueViolation:
        raise ValueError(
            f"job {wanted} cannot run again while a live job holds its unique key"
        ) from None
    if was is None:
        raise JobNotFound(
            f"no job has the id {wanted} (it never existed, or was pruned)", job_id=wanted
        )
    if was == "no step":
        raise ValueError(f"job {wanted} has no step named {from_step!r}")
    if was not in ("done", "failed", "cancelled"):
        raise ValueError(f"job {wanted} is {was}: only a job that ended can run again")
    return RetryResult(was=was, steps_forgotten=forgotten)


async def pause(conn: Conn, store: Store, queue: str) -> bool:
    """Stop every worker claiming from ``queue``; False if it was paused already."""
    return await store.pause_queue(conn, queue=validate_name("queue", queue))


async def resume(conn: Conn, store: Store, queue: str) -> bool:
    """Let workers claim from ``queue`` again; False if it was not paused."""
    return await store.resume_queue(conn, queue=validate_name("queue", queue))


# Where a limit comes from, as `limits` shows it.
@dataclass(frozen=True, kw_only=True, slots=True)
class LimitInfo:
    """A task's limits in force (or a queue's overrides), each with its source: "code"
    (declared on ``@app.task``), "override" (set for the task at runtime) or "queue
    override" (set for its queue); None where there is no such limit. ``known`` is False
    for an override of a task or queue the App does not have (kept, for the workers of
    an App that does)."""

    kind: str  # "task" or "queue"
    name: str
    queue: str | None
    concurrency: int | None
    concurrency_source: str | None
    rate_limit: str | None
    rate_limit_source: str | None
    group_concurrency: int | None
    group_concurrency_source: str | None
    known: bool = True


def limit_target(name: str, tasks: Mapping[str, str]) -> tuple[str, bool]:
    """Whether ``name`` is a task ("task") or a queue ("queue") of an App whose ``tasks``
    map each name to its queue, and whether the App knows it (an unknown name is taken
    for a task's)."""
    validate_name("task or queue", name)
    if name in tasks:
        return "task", True
    if name in tasks.values():
        return "queue", True
    return "task", False


async def set_limits(
    conn: Conn,
    store: Store,
    name: str,
    tasks: Mapping[str, str],
    *,
    concurrency: object = None,
    rate_limit: object = None,
    group_concurrency: object = None,
) -> Override:
    """Override limits of the task or queue ``name``, kept in the database, and tell every
    worker. ConfigurationError (nothing written) for a bad limit; an unknown name is
    written with a warning."""
    kind, known = limit_target(name, tasks)
    override = Override.given(
        kind,
        name,
        concurrency=concurrency,
        rate_limit=rate_limit,
        group_concurrency=group_concurrency,
    )
    if not known:
        logger.warning(
            "no task or queue of this App is named %r: its limits are kept, for the workers"
            " of an App that has a task of that name",
            name,
            extra={"action": "limits_unknown"},
        )
    await store.set_limits(conn, override=override)
    return override


async def reset_limits(conn: Conn, store: Store, name: str, tasks: Mapping[str, str]) -> bool:
    """Drop the overrides of the task or queue ``name`` (the code's limits hold again), and
    tell every worker; False if it had none."""
    kind, _ = limit_target(name, tasks)
    return await store.reset_limits(conn, kind=kind, name=name)


async def limits(
    conn: Conn, store: Store, tasks: Iterable[tuple[str, str, TaskLimits]]
) -> list[LimitInfo]:
    """Every task's limits in force, each with its source; then each queue's overrides, and
    the overrides of tasks the App does not have."""
    tasks = list(tasks)
    overrides = await store.list_limits(conn)
    found = []
    for (name, s), (_, queue, _) in zip(with_overrides(tasks, overrides), tasks, strict=True):
        found.append(
            LimitInfo(
                kind="task",
                name=name,
                queue=queue,
                concurrency=s.limits.concurrency,
                concurrency_source=SOURCE_NAMES.get(s.concurrency or ""),
                rate_limit=None if s.limits.rate is None else str(s.limits.rate),
                rate_limit_source=SOURCE_NAMES.get(s.rate or ""),
                group_concurrency=s.limits.group_concurrency,
                group_concurrency_source=SOURCE_NAMES.get(s.group_concurrency or ""),
            )
        )
    names, queues = {t[0] for t in tasks}, {t[1] for t in tasks}
    for o in overrides:
        if o.kind == "task" and o.name in names:
            continue
        source = "queue override" if o.kind == "queue" else "override"
        found.append(
            LimitInfo(
                kind=o.kind,
                name=o.name,
                queue=o.name if o.kind == "queue" else None,
                concurrency=o.concurrency,
                concurrency_source=None if o.concurrency is None else source,
                rate_limit=None if o.rate is None else str(o.rate),
                rate_limit_source=None if o.rate is None else source,
                group_concurrency=o.group_concurrency,
                group_concurrency_source=None if o.group_concurrency is None else source,
                known=o.name in (queues if o.kind == "queue" else names),
            )
        )
    return found


STATUSES = tuple(str(s) for s in Status)
PAGED = (None, "done", "failed", "cancelled")  # the listings `jobs` pages on by before_id
MAX_LISTING = 10_000
SHOWN = 100  # of a job's steps, children and jobs it waits for, `job` reads so many


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job as a listing shows it, its fields named as in `JobDetail`: ``run_at`` is
    None for a waiting job that no time wakes (it waits for an event or other jobs);
    ``waiting_for`` is what a waiting job waits for (``sleep``, ``event:<key>``,
    ``jobs`` or ``after``), else None."""

    id: int
    task_name: str
    queue: str
    status: str
    priority: int
    attempts_used: int
    max_attempts: int
    run_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    locked_by: str | None
    last_error: str | None
    waiting_for: str | None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobSummary:
        return cls(*row)

    @property
    def error(self) -> str | None:
        """The first line of ``last_error``: what a row of a listing shows."""
        return self.last_error.splitlines()[0] if self.last_error else None


@dataclass(frozen=True, slots=True)
class Step:
    """A step of a job's task, as recorded when it finished. ``seq``: its call among the
    calls of its name in one run; ``status``: ``done``, or ``waiting`` for the sleep or
    the wait for an event that the job waits in now (asyncq records its own under the
    names ``asyncq.sleep``, ``asyncq.wait:<key>`` and ``asyncq.spawn:<task>``);
    ``attempt``: the attempt that recorded it; ``duration_seconds``: from its start to
    its record; ``result_bytes``: its stored result's size as JSON."""

    name: str
    seq: int
    status: str
    attempt: int
    started_at: datetime | None
    finished_at: datetime
    duration_seconds: float | None
    result_bytes: int | None


@dataclass(frozen=True, slots=True)
class Child:
    id: int
    task: str
    status: str


@dataclass(frozen=True, slots=True)
class Children:
    """The jobs a job's task spawned: how many, how many of each state, and the first of
    them by id (``jobs``: at most `SHOWN`)."""

    total: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    jobs: list[Child] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class After:
    """A job deferred with ``options(after=...)``: the jobs it runs after, and what it
    does when one of them did not end done (``cancel`` or ``run``)."""

    ids: list[int]
    on_parent_failure: str


@dataclass(frozen=True, slots=True)
class WaitingFor:
    """What a waiting job waits for. ``kind``: ``sleep`` (until ``until``), ``event``
    (the event ``key``; ``until``: the wait's timeout, None without one), ``jobs`` (a
    gather of its children or of other jobs) or ``after`` (the jobs it runs after);
    ``ids``: the jobs it still waits for (the first `SHOWN`, by id), ``remaining``: how
    many."""

    kind: str
    until: datetime | None = None
    key: str | None = None
    ids: list[int] = field(default_factory=list)
    remaining: int = 0


@dataclass(frozen=True, slots=True)
class LogLine:
    """A record a task logged during an attempt (``--log-capture``): when, at what level,
    by which logger, its message, and the traceback it carried, if any."""

    at: datetime
    level: str
    logger: str
    message: str
    exception: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptLogs:
    """What a task logged during an attempt: the first records and the latest that fit
    the bounds (see docs/how-to/operate.md), and how many were dropped between them."""

    records: list[LogLine]
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class Progress:
    """What a task reported last (``ctx.progress``): a ``fraction`` (0.0 to 1.0) or a
    ``count``, a ``message``, the ``attempt`` that reported it, and when (``at``, the
    worker's clock)."""

    fraction: float | None
    count: int | None
    message: str | None
    attempt: int | None
    at: datetime | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a job (a run of its task by a worker). ``outcome``: how it ended:
    ``done``, ``retried``, ``failed``, ``snoozed``, ``handed_back``, ``given_back``,
    ``cancelled``, ``lease_expired`` (its worker stopped renewing the lease), ``waiting``
    (the task suspended its job: ``waiting_for`` says for what), or ``running`` (it has
    not ended). ``attempt`` is its number as the task saw it (attempts that do not count
    share their number with the next). ``due_at`` is when the job was due to run, so
    ``wait_seconds`` is from then to the attempt's start and ``run_seconds`` from its start
    to its end (to now, while it runs). ``error``: what it raised, with the traceback;
    ``logs``: what its task logged; ``progress``: what it reported last."""

    attempt: int
    outcome: str
    worker: str | None
    due_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    wait_seconds: float | None
    run_seconds: float | None
    error: str | None = None
    logs: AttemptLogs | None = None
    progress: Progress | None = None
    waiting_for: str | None = None


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job in full; ``args`` and ``result`` decoded from JSON (``args`` is the stored
    text when it cannot be decoded); ``run_at`` None for a waiting job that no time
    wakes; ``attempts_used`` the attempts counted against ``max_attempts``;
    ``started_at`` when its latest attempt started. ``attempts``: every attempt kept,
    oldest first (the first 3 and the last 10 of those that did not end done, and the
    latest while it runs or once it is done; ``attempts_dropped`` counts those left out);
    ``progress`` what its task reported last. Its work beyond itself: ``steps`` (the
    first `SHOWN` recorded, of ``steps_total``), ``step_names`` (each once, in the order
    first recorded: what a retry can start from), ``parent`` (the job that spawned it),
    ``children``, ``after`` and, while it waits, ``waiting_for`` (`job_sync` leaves these
    empty). ``effective_priority``: for a queued job that is due, its priority risen one
    level for every ``priority_aging`` seconds it has been due (what a worker's
    ``--priority-aging`` claims it by); None otherwise."""

    id: int
    task_name: str
    queue: str
    status: str
    priority: int
    attempts_used: int
    max_attempts: int
    claims: int
    handbacks: int
    run_at: datetime | None
    created_at: datetime
    locked_by: str | None
    locked_at: datetime | None
    expires_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    unique_key: str | None
    group_key: str | None
    schedule: str | None
    scheduled_at: datetime | None
    abort_requested_at: datetime | None
    last_error: str | None
    args: Any
    result: Any
    attempts: list[Attempt] = field(default_factory=list)
    attempts_dropped: int = 0
    progress: Progress | None = None
    steps: list[Step] = field(default_factory=list)
    steps_total: int = 0
    step_names: list[str] = field(default_factory=list)
    parent: int | None = None
    children: Children = field(default_factory=Children)
    after: After | None = None
    waiting_for: WaitingFor | None = None
    effective_priority: int | None = None


# The columns of the job_detail statement: the fields without a default.
_DETAIL_COLUMNS = [
    f.name for f in fields(JobDetail) if f.default is MISSING and f.default_factory is MISSING
]


@dataclass(frozen=True, slots=True)
class QueueOverview:
    name: str
    ready: int
    scheduled: int
    oldest_ready_seconds: float | None
    running: int
    waiting: int
    failed: int
    done_last_hour: int
    paused: bool


@dataclass(frozen=True, slots=True)
class Horizon:
    """The oldest snapshot in the cluster: vacuum keeps every row version newer than it."""

    kind: str  # session, replication slot, prepared transaction
    holder: str
    seconds: float | None  # how long it has been open (unknown for a slot)
    xids: int  # how many transactions behind it is


@dataclass(frozen=True, slots=True)
class TableStats:
    """The jobs table's health: rows by state (done ones estimated from the statistics:
    counting them would read most of the table; never fewer than those done in the
    throughput's window, which are counted), what vacuum has to do and when it last
    did it, whether autovacuum runs (``autovacuum``: on the server; ``autovacuum_off``:
    asyncq's tables it skips by their own setting), sizes, what holds the vacuum horizon
    back, throughput, and warnings."""

    rows: dict[str, int]
    live_tuples: int
    dead_tuples: int
    inserts: int
    updates: int
    hot_updates: int
    deletes: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_analyze: datetime | None
    last_autoanalyze: datetime | None
    vacuum_count: int
    autovacuum_count: int
    autovacuum: bool
    autovacuum_off: list[str]
    now: datetime
    table_bytes: int
    index_bytes: int
    total_bytes: int
    index_sizes: dict[str, int]
    horizon: Horizon | None
    throughput: list[tuple[datetime, str, int]]
    warnings: list[str] = field(default_factory=list)


def as_json(value: Any) -> str:
    """One of the records above (or a list of them) as JSON, on one line; times in ISO
    8601."""

    def plain(v: Any) -> Any:
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, Decimal):
            return float(v)
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        if hasattr(v, "__dataclass_fields__"):
            return plain(asdict(v))
        return v

    return json.dumps(plain(value), ensure_ascii=False)


def json_lines(records: Iterable[Any]) -> Iterator[str]:
    """A listing as JSON Lines, the shape of every listing's ``--json``: one object per
    record, one line each (no line at all for an empty listing)."""
    return (as_json(record) for record in records)


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTING:
        raise ValueError(f"the limit is a whole number from 1 to {MAX_LISTING}, not {limit!r}")
    return limit


def _filters(
    status: str | None, queue: str | None, task: str | None, before_id: int | None
) -> dict[str, Any]:
    """A listing's filters, checked: what `jobs` and `count_jobs` pass to the store."""
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown status {status!r}: one of {', '.join(STATUSES)}")
    if before_id is not None:
        if status not in PAGED:
            raise ValueError(
                f"before_id pages on through jobs newest first, not through {status} ones"
            )
        [before_id] = job_ids([before_id])
    return {
        "status": status,
        "queue": None if queue is None else validate_name("queue", queue),
        "task": None if task is None else validate_name("task", task),
        "before_id": before_id,
    }


async def jobs(
    conn: Conn,
    store: Store,
    *,
    status: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    limit: int = 20,
    before_id: int | None = None,
) -> list[JobSummary]:
    """Jobs, newest first, or in the order they will run (queued) or their leases end
    (running); narrowed by status, queue and task name. ``before_id`` pages on: the jobs
    listed after that one, for the newest-first listings (every state, or an ended one).
    """
    filters = _filters(status, queue, task, before_id)
    rows = await store.list_jobs(conn, **filters, limit=_limit(limit))
    return [JobSummary.from_row(row) for row in rows]


COUNTED = 1_000  # a listing cut short counts its rows this far: "20 of 1,000+ shown"


@dataclass(frozen=True, slots=True)
class Count:
    """How many records a listing holds: ``n``, exactly; or, with ``more``, more than
    ``n`` (counting stopped there)."""

    n: int
    more: bool = False


async def count_jobs(
    conn: Conn,
    store: Store,
    *,
    status: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    before_id: int | None = None,
    at_most: int = COUNTED,
) -> Count:
    """How many jobs `jobs` would list with these filters and no limit, counted through
    the listing's own index up to ``at_most``: reading at most ``at_most + 1`` rows
    whatever the table holds, it costs what listing that many would."""
    filters = _filters(status, queue, task, before_id)
    at_most = _limit(at_most)
    n = await store.count_jobs(conn, **filters, at_most=at_most + 1)
    return Count(at_most, more=True) if n > at_most else Count(n)


async def job(
    conn: Conn, store: Store, job_id: int, *, priority_aging: float = PRIORITY_AGING
) -> JobDetail | None:
    """One job in full, with its steps, children, dependencies and waits; None when
    there is no such job. ``priority_aging``: the workers' ``--priority-aging``, for the
    job's effective priority."""
    [wanted] = job_ids([job_id])
    found = _detail(await store.job_detail(conn, job_id=wanted), priority_aging)
    if found is None:
        return None
    work = await store.job_workflow(conn, job_id=wanted, limit=SHOWN)
    return found if work is None else _with_workflow(found, work)


def job_sync(conn: SyncConn, store: Store, job_id: int) -> JobDetail | None:
    """`job` on a synchronous connection (the Django backend's, `asyncq.contrib.django`),
    without the job's steps, children, dependencies and waits."""
    [wanted] = job_ids([job_id])
    return _detail(store.job_detail_sync(conn, job_id=wanted), PRIORITY_AGING)


def _detail(row: tuple[Any, ...] | None, priority_aging: float) -> JobDetail | None:
    if row is None:
        return None
    columns = len(_DETAIL_COLUMNS)
    values = dict(zip(_DETAIL_COLUMNS, row[:columns], strict=True))
    progress_text, logs_text, history_text, now = row[columns:]
    with contextlib.suppress(ValueError):  # else shown as stored
        values["args"] = json.loads(values["args"])
    if values["result"] is not None:
        values["result"] = json.loads(values["result"])
    progress = _progress(None if progress_text is None else json.loads(progress_text))
    history = {} if history_text is None else json.loads(history_text)
    attempts = [_attempt(record) for record in history.get("attempts", [])]
    status = values["status"]
    if status in (Status.RUNNING, Status.DONE):
        # The latest attempt, described by the row itself (done: the plain path records
        # nothing more).
        started, ended = values["started_at"], values["finished_at"]
        due = values["run_at"]
        attempts.append(
            Attempt(
                attempt=values["attempts_used"],
                outcome=str(status),
                worker=values["locked_by"],
                due_at=due,
                started_at=started,
                ended_at=ended if status == Status.DONE else None,
                wait_seconds=_seconds(due, started),
                run_seconds=_seconds(started, ended if status == Status.DONE else now),
                logs=_logs(None if logs_text is None else json.loads(logs_text)),
                progress=progress,
            )
        )
    return JobDetail(
        **values,
        attempts=attempts,
        attempts_dropped=int(history.get("dropped", 0)),
        progress=progress,
        effective_priority=effective_priority(
            status, values["priority"], values["run_at"], now, priority_aging
        ),
    )


def effective_priority(
    status: str, priority: int, run_at: datetime | None, now: datetime, aging: float
) -> int | None:
    """A queued job's priority risen one level for every ``aging`` seconds it has been
    due; None for a job that is not queued and due, or with aging off (0)."""
    if status != Status.QUEUED or run_at is None or run_at > now or aging <= 0:
        return None
    return priority + int((now - run_at).total_seconds() // aging)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else max((end - start).total_seconds(), 0.0)


def _attempt(record: dict[str, Any]) -> Attempt:
    due, started, ended = (_time(record.get(k)) for k in ("due_at", "started_at", "ended_at"))
    return Attempt(
        attempt=int(record.get("attempt", 0)),
        outcome=str(record.get("outcome", "-")),
        worker=record.get("worker"),
        due_at=due,
        started_at=started,
        ended_at=ended,
        wait_seconds=_seconds(due, started),
        run_seconds=_seconds(started, ended),
        error=record.get("error"),
        logs=_logs(record.get("logs")),
        progress=_progress(record.get("progress")),
        waiting_for=record.get("waiting_for"),
    )


def _logs(raw: dict[str, Any] | None) -> AttemptLogs | None:
    if not raw:
        return None
    records = [
        LogLine(
            at=datetime.fromisoformat(r["at"]),
            level=str(r.get("level", "")),
            logger=str(r.get("logger", "")),
            message=str(r.get("message", "")),
            exception=r.get("exception"),
        )
        for r in raw.get("records", [])
    ]
    return AttemptLogs(records=records, dropped=int(raw.get("dropped", 0)))


def _progress(raw: dict[str, Any] | None) -> Progress | None:
    if not raw:
        return None
    return Progress(
        fraction=raw.get("fraction"),
        count=raw.get("count"),
        message=raw.get("message"),
        attempt=raw.get("attempt"),
        at=_time(raw.get("at")),
    )


def _with_workflow(detail: JobDetail, row: tuple[Any, ...]) -> JobDetail:
    (
        steps,
        steps_total,
        step_names,
        children,
        by_status,
        parent,
        after,
        after_failure,
        status,
        waiting_for,
        run_at,
        awaited,
        remaining,
    ) = row
    waiting = _waiting_for(waiting_for, run_at, awaited, remaining) if status == "waiting" else None
    return replace(
        detail,
        steps=_steps(json.loads(steps), waiting),
        steps_total=steps_total,
        step_names=list(step_names),
        parent=parent,
        children=Children(
            total=sum(json.loads(by_status).values()),
            by_status=json.loads(by_status),
            jobs=[Child(c["id"], c["task"], c["status"]) for c in json.loads(children)],
        ),
        after=None if after is None else After(ids=list(after), on_parent_failure=after_failure),
        waiting_for=waiting,
    )


def _waiting_for(
    kind: str | None, until: datetime | None, awaited: list[int], remaining: int
) -> WaitingFor:
    if kind is not None and kind.startswith("event:"):
        return WaitingFor("event", until=until, key=kind.removeprefix("event:"))
    if kind == "sleep":
        return WaitingFor("sleep", until=until)
    return WaitingFor(kind or "-", until=until, ids=list(awaited), remaining=remaining)


def _steps(raw: list[dict[str, Any]], waiting: WaitingFor | None) -> list[Step]:
    """The recorded steps; the sleep or the wait the job waits in is the last one of its
    name (a sleep or a wait is recorded as the job suspends)."""
    waits_in = None
    if waiting is not None and waiting.kind == "sleep":
        waits_in = SLEEP
    elif waiting is not None and waiting.kind == "event":
        waits_in = f"{WAIT}{waiting.key}"
    last = max((i for i, s in enumerate(raw) if s["name"] == waits_in), default=None)
    found = []
    for i, step in enumerate(raw):
        started = _time(step["started_at"])
        finished = _time(step["finished_at"])
        assert finished is not None
        found.append(
            Step(
                name=step["name"],
                seq=step["seq"],
                status="waiting" if i == last else "done",
                attempt=step["attempt"],
                started_at=started,
                finished_at=finished,
                duration_seconds=None
                if started is None
                else max((finished - started).total_seconds(), 0.0),
                result_bytes=step["result_bytes"],
            )
        )
    return found


def _time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker as asyncq_workers lists it: where it runs (``host``, ``pid``), the asyncq
    ``version``, the ``app`` it was started with (``MODULE:APP``, when the ``asyncq``
    command started it), its ``queues`` (None: every queue), ``concurrency``, how many
    jobs it was ``running`` at its last refresh, when it started and when it was last
    seen (``seen_at``, refreshed every ``beat_seconds``). ``alive``: refreshed within
    three beats; else it died without saying so (a kill, a crash, a lost host: its
    heartbeat is missing), and the maintenance deletes its row an hour after it was last
    seen."""

    id: str
    host: str
    pid: int
    version: str
    app: str | None
    queues: list[str] | None
    concurrency: int
    running: int
    started_at: datetime
    seen_at: datetime
    beat_seconds: float
    alive: bool
    seen_seconds_ago: float


async def workers(conn: Conn, store: Store) -> list[WorkerState]:
    """Every worker listed in the database, live ones first (by host), then dead ones."""
    found = []
    for row in await store.list_workers(conn):
        values = dict(zip([f.name for f in fields(WorkerState)], row, strict=True))
        if values["queues"] is not None:
            values["queues"] = list(values["queues"])
        found.append(WorkerState(**values))
    return found


async def queues(conn: Conn, store: Store) -> list[QueueOverview]:
    """Every queue that has jobs (or settings): counts by state, the age of its oldest
    ready job, whether it is paused."""
    return [QueueOverview(*row) for row in await store.queue_overview(conn)]


HISTORY_MINUTES = 60
HISTORY_LONGEST = 7 * 24 * 60
# The minutes read from the jobs' own rows where no sample counted them whole (samples
# alone beyond: the rows of a longer window would be a scan of days of done jobs).
RECENT_MINUTES = 60


@dataclass(frozen=True, slots=True)
class QueueHistory:
    """A queue over the last ``minutes`` clock minutes (the last the minute now in), a
    value per ``per`` minutes, the first the oldest: ``depth``, its ready jobs (due, not
    claimed) at the end of them (None: not known); ``done``, the jobs done in them;
    ``started``, the jobs claimed in them, with ``wait_avg`` and ``wait_max``, their waits
    in seconds from due (``run_at``) to start (None: none claimed). Read from the queue
    samples the workers write each minute (asyncq_queue_samples), which outlive the jobs
    pruned, and from the jobs' own times from the oldest minute of the last hour no
    sample counted whole (there a job retried counts from its latest due time, and one
    deleted only if a sample saw it); older minutes without a sample count nothing."""

    name: str
    minutes: int
    per: int
    depth: list[int | None]
    done: list[int]
    started: list[int]
    wait_avg: list[float | None]
    wait_max: list[float | None]


async def queue_history(
    conn: Conn, store: Store, *, minutes: int = HISTORY_MINUTES, per: int = 1
) -> dict[str, QueueHistory]:
    """Each queue with jobs or samples in the last ``minutes`` (or ready now), by name,
    a value for every ``per`` minutes (a divisor of ``minutes``)."""
    if (
        isinstance(minutes, bool)
        or not isinstance(minutes, int)
        or not 1 <= minutes <= HISTORY_LONGEST
    ):
        raise ValueError(f"minutes is a whole number from 1 to {HISTORY_LONGEST}, not {minutes!r}")
    if isinstance(per, bool) or not isinstance(per, int) or per < 1 or minutes % per:
        raise ValueError(f"per is a whole number that divides {minutes}, not {per!r}")
    samples: dict[str, dict[int, tuple[Any, ...]]] = {}
    for queue, slot, *values in await store.queue_samples(conn, minutes=minutes):
        samples.setdefault(queue, {})[slot] = tuple(values)
    # The job rows from the oldest minute of the last hour that no sample counted whole:
    # with the samplers running, the last minute or two (a sample counts every queue
    # with jobs; a queue's rows all deleted before it counted them are lost either way).
    whole = {slot for by_slot in samples.values() for slot, v in by_slot.items() if v[0]}
    recent = next(
        (minutes - i for i in range(max(0, minutes - RECENT_MINUTES), minutes) if i not in whole),
        0,
    )
    offset = minutes - recent
    rows: dict[str, dict[int, tuple[Any, ...]]] = {}
    if recent:
        for queue, slot, *counts in await store.queue_history(conn, minutes=recent):
            rows.setdefault(queue, {})[offset + slot] = tuple(counts)
    found = {}
    for name in sorted(rows.keys() | samples.keys()):
        by_row, by_sample = rows.get(name, {}), samples.get(name, {})
        depth: list[int | None] = []
        done, started, wait_sum, longest = [], [], [], []
        ready = 0
        for i in range(minutes):
            arrived, departed, ended, claimed, waited, wait_max = by_row.get(
                i, (0, 0, 0, 0, 0.0, None)
            )
            ready += arrived - departed
            sample = by_sample.get(i)
            if sample is None:
                depth.append(ready if i >= offset else None)
            elif sample[0] or i < offset:  # counted whole
                _, sampled_depth, ended, claimed, waited, wait_max = sample
                depth.append(ready if sampled_depth is None and i >= offset else sampled_depth)
            else:
                # A minute still being counted: the jobs of its rows, or those its samples
                # saw, whichever are more (the samples keep those pruned since).
                _, _, sampled_done, sampled_claimed, sampled_wait, sampled_max = sample
                depth.append(ready)
                ended = max(ended, sampled_done)
                if sampled_claimed > claimed:
                    claimed, waited = sampled_claimed, sampled_wait
                wait_max = max((w for w in (wait_max, sampled_max) if w is not None), default=None)
            done.append(ended)
            started.append(claimed)
            wait_sum.append(waited)
            longest.append(wait_max)
        found[name] = _per(name, minutes, per, depth, done, started, wait_sum, longest)
    return found


def _per(
    name: str,
    minutes: int,
    per: int,
    depth: list[int | None],
    done: list[int],
    started: list[int],
    wait_sum: list[float],
    wait_max: list[float | None],
) -> QueueHistory:
    """The minutes' values taken ``per`` minutes at a time."""
    spans = [slice(i, i + per) for i in range(0, minutes, per)]
    ends = [[d for d in depth[s] if d is not None] for s in spans]
    claimed = [sum(started[s]) for s in spans]
    waits = [[w for w in wait_max[s] if w is not None] for s in spans]
    return QueueHistory(
        name=name,
        minutes=minutes,
        per=per,
        depth=[e[-1] if e else None for e in ends],
        done=[sum(done[s]) for s in spans],
        started=claimed,
        wait_avg=[sum(wait_sum[s]) / n if n else None for s, n in zip(spans, claimed, strict=True)],
        wait_max=[max(w) if w else None for w in waits],
    )


async def stats(
    conn: Conn, store: Store, *, max_snapshot_age: float = 300.0, minutes: int = 10
) -> TableStats:
    """The jobs table's health, with a warning for each way vacuum may be losing."""
    counts = await store.state_counts(conn)
    health = await store.table_health(conn)
    assert health is not None, "the jobs table has no statistics row"
    horizon = await store.oldest_snapshot(conn)
    autovacuum, autovacuum_off = await store.autovacuum_off(conn)
    rows = dict(zip(("queued", "running", "waiting", "failed", "cancelled"), counts, strict=True))
    # Estimated: live tuples less the rest (the statistics lag behind the table); never
    # fewer than the done jobs counted exactly in the throughput's window.
    throughput = [(r[0], r[1], r[2]) for r in await store.throughput(conn, minutes=minutes)]
    recent = sum(n for _, status, n in throughput if status == "done")
    rows["done"] = max(health[0] - sum(rows.values()), recent, 0)
    found = TableStats(
        rows=rows,
        live_tuples=health[0],
        dead_tuples=health[1],
        inserts=health[2],
        updates=health[3],
        hot_updates=health[4],
        deletes=health[5],
        last_vacuum=health[6],
        last_autovacuum=health[7],
        last_analyze=health[8],
        last_autoanalyze=health[9],
        vacuum_count=health[10],
        autovacuum_count=health[11],
        autovacuum=autovacuum,
        autovacuum_off=autovacuum_off,
        now=health[12],
        table_bytes=health[13],
        index_bytes=health[14],
        total_bytes=health[15],
        index_sizes={str(name): int(size) for name, size in await store.index_sizes(conn)},
        horizon=None if horizon is None else Horizon(*horizon),
        throughput=throughput,
    )
    found.warnings.extend(vacuum_warnings(found, max_snapshot_age=max_snapshot_age))
    return found


DEAD_TUPLES_FLOOR = 10_000  # below this, dead tuples are nothing to worry about
AUTOVACUUM_LATE = timedelta(minutes=10)
# Dead row versions per live row that warn however recently the table was vacuumed (a
# claim steps over them all), once there are at least DEAD_PER_LIVE_FLOOR of them.
DEAD_PER_LIVE = 4
DEAD_PER_LIVE_FLOOR = 1_000


def vacuum_warnings(stats: TableStats, *, max_snapshot_age: float) -> list[str]:
    """Why vacuum may be losing on the jobs table, one line each (none: it keeps up).

    A snapshot older than ``max_snapshot_age`` seconds keeps every dead row version newer
    than it, in every table: vacuum runs and removes nothing, and the claim reads more
    pages each time. More than `DEAD_PER_LIVE` dead versions per live row, whenever the
    table was last vacuumed, or dead versions outnumbering live rows with no vacuum for
    a while, mean vacuum does not keep up (or does not run) for this table. Autovacuum
    turned off, on the server or for asyncq's tables, leaves them to manual VACUUMs.
    """
    found = []
    horizon = stats.horizon
    if horizon is not None and horizon.seconds is not None and horizon.seconds > max_snapshot_age:
        found.append(
            f"vacuum is held back: {horizon.kind} {horizon.holder} has held a snapshot for"
            f" {age(horizon.seconds)} ({horizon.xids} transactions ago); no dead row"
            f" newer than it can be removed ({stats.dead_tuples} dead in the jobs table)"
        )
    elif horizon is not None and horizon.seconds is None and horizon.xids > 1_000_000:
        found.append(
            f"vacuum is held back: {horizon.kind} {horizon.holder} is {horizon.xids}"
            " transactions behind; no dead row newer than it can be removed"
        )
    dead, live = stats.dead_tuples, stats.live_tuples
    last = max((t for t in (stats.last_vacuum, stats.last_autovacuum) if t), default=None)
    many = dead >= DEAD_PER_LIVE_FLOOR and dead > DEAD_PER_LIVE * live
    late = dead > max(DEAD_TUPLES_FLOOR, live) and (
        last is None or stats.now - last > AUTOVACUUM_LATE
    )
    if many or late:
        found.append(
            f"vacuum is falling behind: {dead} dead row versions against {live} live ones"
            f" ({dead / max(live, 1):.2f} per live row); the table was last vacuumed"
            f" {since_then(last, stats.now)}"
        )
    if not stats.autovacuum:
        found.append(
            "autovacuum is off on this server (autovacuum = off): only a manual VACUUM"
            " removes the jobs table's dead row versions, which every claim steps over"
        )
    if stats.autovacuum_off:
        tables = ", ".join(stats.autovacuum_off)
        found.append(
            f"autovacuum is off for {tables} (autovacuum_enabled = false): only a manual"
            f" VACUUM removes their dead row versions; ALTER TABLE ... RESET"
            f" (autovacuum_enabled) turns it back on"
        )
    return found


PRUNE_BATCH = 10_000


async def prune(
    conn: Conn,
    store: Store,
    *,
    older_than: timedelta,
    batch: int = PRUNE_BATCH,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Delete done jobs that finished more than ``older_than`` ago, ``batch`` rows per
    statement (each its own short transaction); returns how many were deleted."""
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    deleted = 0
    while True:
        n = await store.prune_done(conn, retention=older_than, limit=batch)
        deleted += n
        if progress is not None:
            progress(deleted)
        if n < batch:
            return deleted


# -- the dashboard's search and its bulk actions ---------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class JobFilter:
    """Which jobs a search finds (every part optional, all of them must hold): ``id``;
    ``status``; ``queue``; ``task``, a prefix of the task's name; ``worker``, the worker
    that holds it; ``since``/``until``, a window of creation times (from, inclusive, to,
    exclusive); ``text``, a piece of its arguments' JSON text, in any case; ``up_to``, the
    highest id (a bulk action changes the jobs its preview counted, not newer ones)."""

    id: int | None = None
    status: str | None = None
    queue: str | None = None
    task: str | None = None
    worker: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None
    up_to: int | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: one of {', '.join(STATUSES)}")
        for number in (self.id, self.up_to):
            if number is not None:
                job_ids([number])
        for kind, name in (("queue", self.queue), ("task", self.task), ("worker", self.worker)):
            if name is not None:
                validate_name(kind, name)
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise ValueError("a filter's times must be aware (with a time zone)")
        if self.text is not None and ("\x00" in self.text or len(self.text) > 1000):
            raise ValueError("the text to search for is at most 1000 characters, without NUL")

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def described(self) -> dict[str, Any]:
        """The parts given, as JSON values (what an audit record keeps)."""
        return {
            k: v.isoformat() if isinstance(v, datetime) else v
            for k, v in self.params().items()
            if v is not None
        }


async def search_jobs(
    conn: Conn, store: Store, where: JobFilter, *, limit: int = 50, offset: int = 0
) -> list[JobSummary]:
    """The jobs ``where`` finds, newest first: ``limit`` of them after the first ``offset``."""
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"the offset is a whole number, not {offset!r}")
    rows = await store.search_jobs(conn, where.params(), limit=_limit(limit), offset=offset)
    return [JobSummary.from_row(row) for row in rows]


@dataclass(frozen=True, slots=True)
class Matched:
    """How many jobs a filter finds (``found``) and how many of them an action would
    change (``changes``: those in the states it acts on), counted no further than
    ``at_most`` (``more``: counting stopped there)."""

    found: int
    changes: int
    more: bool = False


async def newest_id(conn: Conn, store: Store) -> int:
    """The highest job id now (0: no job): what a bulk action's preview counts up to."""
    return await store.newest_id(conn)


async def count_matching(
    conn: Conn,
    store: Store,
    where: JobFilter,
    *,
    eligible: Sequence[str] | None = None,
    at_most: int = 100_000,
) -> Matched:
    """How many jobs ``where`` finds, and how many are in the ``eligible`` states."""
    found, changes = await store.count_matching(
        conn,
        where.params(),
        eligible=None if eligible is None else list(eligible),
        at_most=at_most + 1,
    )
    if found > at_most:
        return Matched(at_most, min(changes, at_most), more=True)
    return Matched(found, changes)


@dataclass(frozen=True, slots=True)
class BulkAction:
    """An action on many jobs: its name, the states of the jobs it changes, and what it
    says it does."""

    name: str
    eligible: tuple[str, ...]
    says: str


BULK_ACTIONS = {
    a.name: a
    for a in (
        BulkAction("requeue", ("failed", "cancelled"), "put back in the queue, attempts reset"),
        BulkAction("cancel", ("queued", "running", "waiting"), "cancelled"),
        BulkAction("delete", ("done", "failed", "cancelled"), "deleted, with their steps"),
        BulkAction("priority", ("queued", "waiting"), "given another priority"),
        BulkAction("move", ("queued", "waiting", "failed", "cancelled"), "moved to another queue"),
    )
}
BULK_BATCH = 500
# A running bulk action moves its record's updated_at at least this often (seconds)...
BULK_HEARTBEAT = 3.0
# ... and a running record still for this long is shown interrupted: its process died.
BULK_STALE = timedelta(seconds=15)


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk action did: the rows it changed, the batches it took, and its audit
    record's id."""

    changed: int
    batches: int
    audit_id: int


class BulkRun:
    """A bulk action whose audit record is written (``audit_id``), to `run`."""

    def __init__(
        self,
        connect: Callable[[], contextlib.AbstractAsyncContextManager[Conn]],
        store: Store,
        action: str,
        where: JobFilter,
        detail: dict[str, Any],
        audit_id: int,
    ) -> None:
        self.connect = connect
        self.store = store
        self.action = action
        self.where = where
        self.detail = detail
        self.audit_id = audit_id

    async def run(
        self, *, batch: int = BULK_BATCH, progress: Callable[[int], None] | None = None
    ) -> BulkResult:
        """Change the jobs, ``batch`` of them at a time in id order, each batch in its
        own short transaction on a connection of its own from ``connect()`` (no lock
        held long, workers go on meanwhile) that also writes the rows changed so far to
        the audit record; then write the record done, failed with the error, or stopped
        (cancelled: its process shuts down; the batch under way rolls back whole)."""
        beating = asyncio.create_task(self._heartbeat())
        try:
            result = await self._batches(batch, progress)
        except BaseException as exc:
            beating.cancel()
            stopped = isinstance(exc, asyncio.CancelledError)
            error = None if stopped else f"{type(exc).__name__}: {exc}".rstrip(": ")
            with contextlib.suppress(Exception):
                async with self.connect() as conn:
                    await self.store.audit_end(
                        conn,
                        audit_id=self.audit_id,
                        state="stopped" if stopped else "failed",
                        error=error,
                    )
            raise
        beating.cancel()
        async with self.connect() as conn:
            await self.store.audit_end(conn, audit_id=self.audit_id, state="done")
        return result

    async def _batches(self, batch: int, progress: Callable[[int], None] | None) -> BulkResult:
        eligible = list(BULK_ACTIONS[self.action].eligible)
        changed = batches = after = 0
        while True:
            async with self.connect() as conn:
                ids = await self.store.bulk_batch(
                    conn, self.where.params(), eligible=eligible, after=after, batch=batch
                )
                if not ids:
                    break
                after = ids[-1]
                batches += 1
                changed += await self._batch(conn, ids, changed)
            if progress is not None:
                progress(changed)
            if len(ids) < batch:
                break
        return BulkResult(changed=changed, batches=batches, audit_id=self.audit_id)

    async def _batch(self, conn: Conn, ids: list[int], before: int) -> int:
        """Change one batch and count it in the audit record, in one transaction: the
        record never counts a row that did not change, nor misses one that did."""
        tries = 1
        while True:
            try:
                async with conn.transaction():
                    changed = await self._change(conn, ids)
                    await self.store.audit_progress(
                        conn, audit_id=self.audit_id, rows=before + changed
                    )
                return changed
            except errors.DeadlockDetected:
                # A cancel meeting a worker's write in a cycle (see `_cancel`): the
                # transaction rolled back whole; the batch is tried again.
                if tries == CANCEL_TRIES:
                    raise
                tries += 1

    async def _change(self, conn: Conn, ids: list[int]) -> int:
        if self.action == "requeue":
            return len(await self.store.requeue_ids(conn, ids=ids))
        if self.action == "cancel":
            outcomes = await _cancel(conn, self.store, ids)
            return sum(1 for o in outcomes.values() if o in ("cancelled", "aborting"))
        return await self.store.bulk_change(conn, self.action, ids=ids, **self.detail)

    async def _heartbeat(self) -> None:
        """Move the record's updated_at while the action runs, a batch waiting on a
        lock too; a failed beat is tried at the next."""
        while True:
            await asyncio.sleep(BULK_HEARTBEAT)
            try:
                async with self.connect() as conn:
                    await self.store.audit_heartbeat(conn, audit_id=self.audit_id)
            except Exception:
                logger.warning("could not mark bulk action %s alive", self.audit_id, exc_info=True)


async def start_bulk(
    connect: Callable[[], contextlib.AbstractAsyncContextManager[Conn]],
    store: Store,
    action: str,
    where: JobFilter,
    *,
    actor: str,
    priority: int | None = None,
    queue: str | None = None,
    matched: int = 0,
) -> BulkRun:
    """Write the audit record of ``action`` (one of `BULK_ACTIONS`) on the jobs ``where``
    finds, running (``actor``: who; the filter; ``matched``: the count its preview
    showed); the returned `BulkRun` runs it."""
    if action not in BULK_ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}: one of {', '.join(BULK_ACTIONS)}")
    detail: dict[str, Any] = {}
    if action == "priority":
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 2**31:
            raise ValueError(f"a priority is a whole number, not {priority!r}")
        detail["priority"] = priority
    if action == "move":
        detail["queue"] = validate_name("queue", queue)
    async with connect() as conn:
        audit_id = await store.audit_start(
            conn,
            actor=actor,
            action=action,
            filter=json.dumps(where.described()),
            detail=json.dumps(detail) if detail else None,
            matched=matched,
        )
    return BulkRun(connect, store, action, where, detail, audit_id)


async def bulk(
    connect: Callable[[], contextlib.AbstractAsyncContextManager[Conn]],
    store: Store,
    action: str,
    where: JobFilter,
    *,
    actor: str,
    priority: int | None = None,
    queue: str | None = None,
    matched: int = 0,
    batch: int = BULK_BATCH,
    progress: Callable[[int], None] | None = None,
) -> BulkResult:
    """`start_bulk`, then run it to the end (``progress``: called with the rows changed
    so far after each batch)."""
    started = await start_bulk(
        connect,
        store,
        action,
        where,
        actor=actor,
        priority=priority,
        queue=queue,
        matched=matched,
    )
    return await started.run(batch=batch, progress=progress)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """What someone did to many jobs at once: when it started (``at``), who (``actor``),
    the ``action``, the ``filter`` that chose the jobs, its ``detail`` (a priority, a
    queue), how many jobs its preview ``matched`` and how many ``rows`` changed so far;
    its ``state`` (running, done, failed with its ``error``, stopped: its process shut
    down before its end, or interrupted: left running by a process that died), and when
    the record last moved (``updated_at``)."""

    id: int
    at: datetime
    actor: str
    action: str
    filter: dict[str, Any]
    detail: dict[str, Any] | None
    rows: int
    matched: int
    state: str
    updated_at: datetime
    error: str | None


async def audit(
    conn: Conn, store: Store, *, limit: int = 100, stale: timedelta = BULK_STALE
) -> list[AuditRecord]:
    """The latest audit records, newest first (a running one whose updated_at is older
    than ``stale``: interrupted)."""
    found = []
    for row in await store.audit_list(conn, limit=_limit(limit), stale=stale):
        id_, at, actor, action, where, detail, rows, matched, state, updated_at, error = row
        found.append(
            AuditRecord(
                id=id_,
                at=at,
                actor=actor,
                action=action,
                filter=json.loads(where),
                detail=None if detail is None else json.loads(detail),
                rows=rows,
                matched=matched,
                state=state,
                updated_at=updated_at,
                error=error,
            )
        )
    return found
