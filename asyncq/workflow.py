"""Work that spans jobs, as a running task sees it: steps, durable sleeps and waits for
events or other jobs, and children (``ctx = asyncq.current_job()``; `Run` does the work).

What runs again, and what does not. A job that suspends itself (a sleep, a wait), that
fails an attempt, that a worker hands back or that the rescuer brings back runs its
task again from the top. Each step that finished returns its stored result without
running; every line outside steps runs again. Steps are keyed by their name and by the
order of the calls of that name in one run (the third ``ctx.step("charge", ...)`` of a
run is the third stored result of "charge"), never by the order of all calls: code may
change between deploys as long as the names of the steps that finished stay.

Every write (a step, a sleep, a wait, a child) is fenced: it happens only while the job
is still running by the claim of this attempt. A worker that lost the lease writes
nothing; its attempt ends at the write (`LeaseLost`), as it would at its outcome.

A suspension ends the attempt without counting it and frees the worker's slot: the
write that suspends the job is made first, then `Suspended` unwinds the task (its
``finally`` blocks run). Neither is an `Exception`: ``except Exception`` lets them by.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from asyncq import codec
from asyncq.errors import ChildFailed, EventTimeout, JobNotFound, NotInWorkflow

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from asyncq.job import Job

MAX_STEP_BYTES = 1024 * 1024  # a step's result, an event's payload, as JSON
MAX_EVENT_KEY_BYTES = 1024
MAX_CHILDREN = 100_000  # jobs one spawn_many writes
SLEEP = "asyncq.sleep"
WAIT = "asyncq.wait:"
SPAWN = "asyncq.spawn:"
RESERVED = "asyncq."
# A sleep whose end passed longer ago than this by the worker's clock is over without
# asking the database (whose clock decides when nearer).
CLOCK_MARGIN = 1.0


class Suspended(BaseException):
    """The attempt suspended its job (a sleep, a wait): written already, it ends here."""


class LeaseLost(BaseException):
    """The job's lease is lost: its attempt may write nothing more, and ends here."""


class Ending(NamedTuple):
    """How a job ended: its status, and its result (JSON text) or its last error."""

    id: int
    status: str
    result: str | None
    last_error: str | None


class Gateway(Protocol):
    """What a running job's workflow calls need of the worker that runs it."""

    async def load_steps(self, job: Job) -> dict[tuple[str, int], str | None]:
        """The results stored for ``job``'s steps, by name and number."""
        ...

    async def write_step(
        self, job: Job, name: str, seq: int, result: str, started: datetime
    ) -> tuple[str, str | None]:
        """Record a step's result: ('written', None), ('exists', the result stored
        before), or ('lost', None)."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A connection of the App's, in a transaction, for a step's own statements."""
        ...

    async def write_step_in(
        self,
        conn: AsyncConnection[Any],
        job: Job,
        name: str,
        seq: int,
        result: str,
        started: datetime,
    ) -> tuple[str, str | None]:
        """`write_step` in the transaction of ``conn``."""
        ...

    async def suspend(self, job: Job, wait: Wait) -> tuple[str, str | None, datetime | None]:
        """Suspend ``job`` for ``wait``, or say why it goes on: (state, event payload,
        the time it is due for)."""
        ...

    async def spawn(self, job: Job, spawn: Spawn) -> list[int] | None:
        """Write child jobs once (their ids recorded as a step); None: the lease is lost."""
        ...

    async def endings(self, ids: Sequence[int]) -> list[Ending]:
        """How each of these jobs ended, or its status while it has not."""
        ...

    def suspended(self, job: Job) -> None:
        """``job`` is suspended: its attempt holds it no more."""
        ...

    def lost(self, job: Job, why: str) -> None:
        """``job``'s lease is lost."""
        ...

    def report_progress(self, job: Job, progress: str) -> None:
        """``job``'s task reported ``progress`` (JSON): to write soon, the latest one
        only. Called from the event loop or from a task's thread."""
        ...


class Wait(NamedTuple):
    """A suspension: until a time (``until``, or ``seconds`` from the database's now), an
    event (``key``), or jobs (``awaited``); with the step that records it, if any."""

    kind: str  # 'sleep', 'event' or 'jobs'
    until: datetime | None = None
    seconds: float | None = None
    key: str | None = None
    awaited: Sequence[int] = ()
    step: str | None = None
    seq: int = 0


class Spawn(NamedTuple):
    step: str
    seq: int
    task_name: str
    queue: str
    args: str  # a JSON array, one element per child
    priority: int
    max_attempts: int


class Run:
    """The workflow of one attempt: how many times each step name was called, and the
    results stored by earlier runs, read once when first needed (a job's first claim has
    none)."""

    __slots__ = ("_calls", "_stored", "gateway", "job")

    def __init__(self, job: Job, gateway: Gateway | None) -> None:
        self.job = job
        self.gateway = gateway
        self._calls: dict[str, int] = {}
        self._stored: dict[tuple[str, int], str | None] | None = {} if job.claim <= 1 else None

    def _gateway(self, what: str) -> Gateway:
        if self.gateway is None:
            raise NotInWorkflow(
                f"ctx.{what} needs an async def task run by a worker (or by asyncq.testing);"
                f" {self.job.task_name} is a plain def task, whose thread cannot suspend its"
                " job: make it an async def, or keep these calls out of it"
            )
        return self.gateway

    def _next(self, name: str) -> int:
        seq = self._calls.get(name, 0) + 1
        self._calls[name] = seq
        return seq

    async def _stored_step(self, name: str, seq: int) -> tuple[bool, str | None]:
        stored = self._stored
        if stored is None:
            stored = self._stored = await self._gateway("step").load_steps(self.job)
        key = (name, seq)
        if key in stored:
            return True, stored[key]
        return False, None

    # -- steps ------------------------------------------------------------------------

    async def step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        gateway = self._gateway("step")
        _check_step_name(name)
        seq = self._next(name)
        found, stored = await self._stored_step(name, seq)
        if found:
            return _decoded(stored)
        started = datetime.now(UTC)
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        text = _step_json(name, result)
        state, existing = await gateway.write_step(self.job, name, seq, text, started)
        return self._written(name, state, text, existing)

    async def step_tx(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        gateway = self._gateway("step_tx")
        _check_step_name(name)
        seq = self._next(name)
        found, stored = await self._stored_step(name, seq)
        if found:
            return _decoded(stored)
        started = datetime.now(UTC)
        outcome: tuple[str, str | None] = ("", None)
        text = ""
        try:
            async with gateway.transaction() as conn:
                result = fn(conn, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                text = _step_json(name, result)
                outcome = await gateway.write_step_in(conn, self.job, name, seq, text, started)
                if outcome[0] != "written":
                    raise _RollBack()
        except _RollBack:
            pass  # the step's statements are rolled back: lost, or recorded before
        return self._written(name, outcome[0], text, outcome[1])

    def _written(self, name: str, state: str, text: str, existing: str | None) -> Any:
        if state == "lost":
            self._lose(f"before its step {name!r} was recorded")
        if state == "exists":  # recorded by an earlier write whose answer was lost
            return _decoded(existing)
        return _decoded(text)

    def _lose(self, why: str) -> None:
        assert self.gateway is not None
        self.gateway.lost(self.job, why)
        raise LeaseLost(why)

    # -- durable sleeps and waits -----------------------------------------------------

    async def sleep_until(self, until: datetime | None, seconds: float | None = None) -> None:
        gateway = self._gateway("sleep")
        seq = self._next(SLEEP)
        found, stored = await self._stored_step(SLEEP, seq)
        if found:
            until = _stored_until(stored)
            if until is not None and until.timestamp() < time.time() - CLOCK_MARGIN:
                return
            wait = Wait("sleep", until=until)
        else:
            wait = Wait("sleep", until=until, seconds=seconds, step=SLEEP, seq=seq)
        state, _, _ = await gateway.suspend(self.job, wait)
        self._suspended(state, "a sleep")

    async def wait_for_event(self, key: str, timeout: float | None) -> Any:  # noqa: ASYNC109
        gateway = self._gateway("wait_for_event")
        _check_event_key(key)
        name = WAIT + key
        seq = self._next(name)
        found, stored = await self._stored_step(name, seq)
        if found:
            wait = Wait("event", until=_stored_until(stored), key=key)
        else:
            wait = Wait("event", seconds=timeout, key=key, step=name, seq=seq)
        state, payload, _ = await gateway.suspend(self.job, wait)
        if state == "emitted":
            return _decoded(payload)
        if state == "timeout":
            raise EventTimeout(f"no event {key!r} came within the timeout of the wait", key=key)
        self._suspended(state, f"a wait for the event {key!r}")
        return None  # not reached

    def _suspended(self, state: str, what: str) -> None:
        """Raise what ends the attempt after a suspension; return if the job goes on."""
        if state == "waiting":
            assert self.gateway is not None
            self.gateway.suspended(self.job)
            raise Suspended(what)
        if state == "lost":
            self._lose(f"before {what} was recorded")

    # -- children ---------------------------------------------------------------------

    async def spawn_many(self, task: Any, calls: list[dict[str, Any]]) -> list[int]:
        gateway = self._gateway("spawn")
        target, opts = _target(task)
        name = SPAWN + target.name
        seq = self._next(name)
        found, stored = await self._stored_step(name, seq)
        if found:
            return [int(i) for i in _decoded(stored)]
        if len(calls) > MAX_CHILDREN:
            raise ValueError(f"spawn_many writes at most {MAX_CHILDREN} jobs, not {len(calls)}")
        args = target.encode_many(calls) if calls else "[]"
        ids = await gateway.spawn(
            self.job,
            Spawn(name, seq, target.name, opts.queue, args, opts.priority, opts.max_attempts),
        )
        if ids is None:
            self._lose(f"before its children of {target.name} were written")
        assert ids is not None
        return ids

    async def spawn(self, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        gateway = self._gateway("spawn")
        target, opts = _target(task)
        name = SPAWN + target.name
        seq = self._next(name)
        found, stored = await self._stored_step(name, seq)
        if found:
            return int(_decoded(stored)[0])
        encoded = "[" + target.encode(args, kwargs) + "]"
        ids = await gateway.spawn(
            self.job,
            Spawn(name, seq, target.name, opts.queue, encoded, opts.priority, opts.max_attempts),
        )
        if ids is None:
            self._lose(f"before its child of {target.name} was written")
        assert ids is not None
        return ids[0]

    async def gather(self, ids: Sequence[int], *, return_exceptions: bool) -> list[Any]:
        gateway = self._gateway("gather")
        wanted = [_job_id(i) for i in ids]
        if not wanted:
            return []
        endings = {e.id: e for e in await gateway.endings(wanted)}
        live = [i for i in wanted if i in endings and endings[i].status in _LIVE]
        if live:
            state, _, _ = await gateway.suspend(self.job, Wait("jobs", awaited=live))
            self._suspended(state, f"a gather of {len(wanted)} jobs")
            endings = {e.id: e for e in await gateway.endings(wanted)}  # they all ended
        return [_gathered(i, endings.get(i), return_exceptions) for i in wanted]


_LIVE = frozenset({"queued", "running", "waiting"})


class _RollBack(Exception):
    pass


def _gathered(job_id: int, ending: Ending | None, return_exceptions: bool) -> Any:
    if ending is None:
        error: BaseException = JobNotFound(
            f"ctx.gather(): no job has the id {job_id} (it never existed, or was pruned)",
            job_id=job_id,
        )
    elif ending.status == "done":
        return _decoded(ending.result)
    else:
        error = ChildFailed(
            f"job {job_id} {ending.status}: {ending.last_error or '(no error recorded)'}",
            job_id=job_id,
            last_error=ending.last_error,
        )
    if return_exceptions:
        return error
    raise error


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"ctx.gather() takes job ids (ints), not {value!r}")
    return value


def _target(task: Any) -> tuple[Any, Any]:
    """The task and the options of a `Task` or of a `Deferrer` (``task.options(...)``)."""
    if hasattr(task, "opts") and hasattr(task, "task"):  # a Deferrer
        o = task.opts
        given = [
            f"{name}="
            for name, value in (
                ("conn", o.conn),
                ("unique_key", o.unique_key),
                ("delay", o.delay),
                ("run_at", o.run_at),
                ("group", o.group),
                ("after", o.after),
            )
            if value
        ]
        if given:
            raise ValueError(
                "a child job is written by the worker, ready at once, with the queue,"
                f" priority and max_attempts of its options: options({', '.join(given)})"
                " do not apply to ctx.spawn"
            )
        return task.task, o
    if hasattr(task, "defaults") and hasattr(task, "encode_many"):
        return task, task.defaults
    raise TypeError(f"ctx.spawn() takes a task (or task.options(...)), not {task!r}")


def _check_step_name(name: object) -> None:
    codec.validate_name("step", name)
    assert isinstance(name, str)
    if name.startswith(RESERVED):
        raise ValueError(f"step names starting with {RESERVED!r} are asyncq's own: {name!r}")


def _check_event_key(key: object) -> None:
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ValueError(f"an event key must be a non-empty string without NUL, not {key!r}")
    if not key.isascii() and not codec.is_text(key):
        raise ValueError(f"an event key must not contain a lone surrogate: {key!r}")
    if len(key.encode("utf-8")) > MAX_EVENT_KEY_BYTES:
        raise ValueError(f"an event key must be at most {MAX_EVENT_KEY_BYTES} bytes of UTF-8")


def event_json(key: str, payload: Any) -> str:
    """An event's payload as JSON text that PostgreSQL can store (`ArgumentsError` or
    `PayloadTooLarge` says why it cannot be)."""
    _check_event_key(key)
    what = f"the payload of event {key!r}"
    return codec.encode_json(payload, what, MAX_STEP_BYTES, "the cap of event payloads")


def _step_json(name: str, result: Any) -> str:
    if result is None:
        return "null"
    what = f"the result of step {name!r} (stored, so it must be JSON)"
    return codec.encode_json(result, what, MAX_STEP_BYTES, "the cap of step results")


def _decoded(text: str | None) -> Any:
    if text is None or text == "null":
        return None
    return codec.decode(text)


def _stored_until(stored: str | None) -> datetime | None:
    value = _decoded(stored)
    until = value.get("until") if isinstance(value, dict) else None
    return datetime.fromisoformat(until) if isinstance(until, str) else None


def sleep_seconds(duration: float | timedelta) -> float:
    """A sleep's length in seconds; `ValueError` for a negative or non-finite one."""
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"ctx.sleep() takes seconds or a timedelta, not {duration!r}")
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"ctx.sleep() takes a length of time from 0 on, not {duration!r}")
    return float(seconds)
