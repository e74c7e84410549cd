"""Operations on jobs, queues and schedules that people run (the ``asyncq`` command and
the App's methods): requeue, cancel, pause and resume, list the schedules. Each takes a
connection and the App's store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from asyncq.codec import validate_name
from asyncq.job import Status
from asyncq.schedule import Cron, Schedule
from asyncq.store import Conn, Store


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


async def cancel(conn: Conn, store: Store, ids: Sequence[int]) -> dict[int, str]:
    """Cancel jobs: what happened to each, in the order given: ``cancelled`` (it was
    queued), ``aborting`` (it runs: its worker stops it and writes it cancelled), else
    why not: its status (``done``, ``failed``, ``cancelled``) or ``not found``."""
    wanted = list(dict.fromkeys(job_ids(ids)))
    found = await store.cancel(conn, ids=wanted) if wanted else {}
    return {i: found.get(i, NOT_FOUND) for i in wanted}


async def pause(conn: Conn, store: Store, queue: str) -> bool:
    """Stop every worker claiming from ``queue``; False if it was paused already."""
    return await store.pause_queue(conn, queue=validate_name("queue", queue))


async def resume(conn: Conn, store: Store, queue: str) -> bool:
    """Let workers claim from ``queue`` again; False if it was not paused."""
    return await store.resume_queue(conn, queue=validate_name("queue", queue))
