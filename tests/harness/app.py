"""The tasks that the harness's worker processes run (``tests.harness.app:app``).

Every execution appends to the ledger (`tests.harness.ledger`): ``start``, then ``end``
when the task returns, ``cancel`` when it is cancelled, and a few events of its own.

The environment sets the App up: ``$ASYNCQ_DSN`` the database, ``$HARNESS_SCHEMA`` its
schema (unset: the connection's current one), ``$HARNESS_CONNECT_TIMEOUT`` the connect
timeout (10 s), ``$HARNESS_POOL_MAX`` the pool's size (unset: asyncq's default);
behind PgBouncer (``tests/pgbouncer``), ``$HARNESS_LISTEN_DSN`` where the LISTEN
connections go, ``$HARNESS_LISTEN=0`` none at all, ``$HARNESS_PREPARE_THRESHOLD``
psycopg's (``none``: no prepared statements);
``$HARNESS_FIXED=1`` fixes the bug of `until_fixed`, ``$HARNESS_SELF_STOP=1`` makes
`freeze_then` stop its own worker process with SIGSTOP during attempt 1: the freeze
then falls at a known point of the task, so what the task does once thawed happens
before any other part of the worker runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Any

import anyio

import asyncq
from tests.harness.ledger import record

_pool_max = os.environ.get("HARNESS_POOL_MAX")
_prepare = os.environ.get("HARNESS_PREPARE_THRESHOLD", "5")
app = asyncq.App(
    schema=os.environ.get("HARNESS_SCHEMA") or None,
    connect_timeout=float(os.environ.get("HARNESS_CONNECT_TIMEOUT", "10")),
    pool_max_size=int(_pool_max) if _pool_max else None,
    listen_dsn=os.environ.get("HARNESS_LISTEN_DSN") or None,
    listen=os.environ.get("HARNESS_LISTEN", "1") != "0",
    prepare_threshold=None if _prepare == "none" else int(_prepare),
)

AT_ONCE = asyncq.Backoff(base=0, cap=0, jitter=0)
# A task name with quotes, a semicolon, a comment and non-ASCII letters: only a name.
ODD_NAME = "odd'\"; DROP TABLE asyncq_jobs; -- naïve ✓ 名前"


async def _sleep(seconds: float) -> None:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record("cancel")
        raise


# -- the everyday tasks ------------------------------------------------------------------


@app.task
async def noop(n: int = 0) -> None:
    record("start")
    record("end")


@app.task
async def sleep(seconds: float) -> None:
    record("start")
    await _sleep(seconds)
    record("end")


@app.task(max_attempts=10)
async def work(ms: int = 0, tag: int = 0) -> None:
    """Sleeps ``ms`` milliseconds (none: a no-op). ``tag`` is the test's own name for it."""
    record("start")
    if ms:
        await _sleep(ms / 1000)
    record("end")


@app.task(max_attempts=2, retry=asyncq.Backoff(base=0.1, cap=0.2))
async def fail(tag: int = 0) -> None:
    """Always raises: retried once after a short backoff, then failed."""
    record("start")
    raise RuntimeError(f"job {tag} fails on purpose")


@app.task
async def sleep_by_attempt(seconds: list[float]) -> None:
    """Sleeps ``seconds[attempt - 1]``."""
    record("start")
    await _sleep(seconds[asyncq.current_job().attempt - 1])
    record("end")


@app.task(retry=asyncq.Backoff(base=40.0, factor=1.0, jitter=0.0))
async def fail_slowly_retried() -> None:
    """Always fails; retried exactly 40 s later."""
    record("start")
    raise RuntimeError("fails on purpose")


@app.task
async def echo(value: object = None) -> object:
    """Returns its argument: the job's result."""
    record("start")
    record("end")
    return value


@app.task
async def slow_echo(seconds: float, value: object = None) -> object:
    """Sleeps ``seconds``, then returns its argument: the job's result."""
    record("start")
    await asyncio.sleep(seconds)
    record("end")
    return value


@app.task
async def unstorable(kind: str) -> object:
    """Returns what cannot be stored as JSON: a set, or NaN."""
    record("start")
    record("end")
    return {1, 2} if kind == "set" else float("nan")


# -- tasks that misbehave ------------------------------------------------------------------


@app.task
async def kill_own_worker() -> None:
    """Kills the worker process running it, as a segfault or the OOM killer would."""
    record("start")
    os.kill(os.getpid(), signal.SIGKILL)
    await asyncio.sleep(60)
    record("end")


@app.task(max_attempts=3)
async def freeze_then(then: str, seconds: float = 0.0) -> None:
    """With ``$HARNESS_SELF_STOP=1``, attempt 1 stops its worker; once continued it
    fails (``then="fail"``), returns (``"succeed"``) or goes on sleeping (``"sleep"``).
    Anywhere else: sleeps ``seconds`` and returns."""
    record("start")
    if os.environ.get("HARNESS_SELF_STOP") == "1" and asyncq.current_job().attempt == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        # Continued: nothing else in this process has run since the stop.
        if then == "fail":
            record("fail")
            raise RuntimeError("late failure of a worker that was frozen")
        if then == "succeed":
            record("end")
            return
    await _sleep(seconds)
    record("end")


@app.task
async def stubborn(seconds: float = 30) -> None:
    """Swallows every cancellation, for ``seconds``."""
    record("start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            record("swallowed")
    record("end")


@app.task
async def hold_connection(seconds: float) -> None:
    """Holds a connection of the worker's App pool while it sleeps."""
    record("start")
    async with app.pool.connection() as conn:
        await conn.execute("SELECT 1")
        record("got_connection")
        await _sleep(seconds)
    record("end")


@app.task
async def takes(a: int, b: str) -> None:
    record("start")
    assert isinstance(a, int) and isinstance(b, str)
    record("end")


@app.task
async def raise_system_exit() -> None:
    record("start")
    raise SystemExit(3)


@app.task
async def raise_keyboard_interrupt() -> None:
    record("start")
    raise KeyboardInterrupt


@app.task(name=ODD_NAME)
async def odd_name(text: str) -> None:
    record("start")
    if text != "ünïcødé ✓ '\";":
        raise ValueError(f"argument came back as {text!r}")
    record("end")


# -- the guarded tasks: logs, least privilege and requeue (retries come at once, so that a
# -- --drain worker runs them before it exits) --------------------------------------------


@app.task(name="guarded.ok", retry=AT_ONCE)
async def ok(token: str = "") -> None:
    record("start")
    record("end")


@app.task(name="guarded.flaky", retry=AT_ONCE, max_attempts=3)
async def flaky(token: str) -> None:
    """Fails its first attempt, then succeeds."""
    record("start")
    if asyncq.current_job().attempt == 1:
        raise PermissionError("first attempt refused")
    record("end")


@app.task(name="guarded.doomed", retry=AT_ONCE, max_attempts=2)
async def doomed(token: str) -> None:
    """Always fails: retried once, then failed."""
    record("start")
    raise ValueError("gateway rejected the request")


@app.task(name="guarded.slow", retry=AT_ONCE, max_attempts=3)
async def slow(token: str, seconds: float) -> None:
    """Sleeps ``seconds`` on its first attempt only."""
    record("start")
    if asyncq.current_job().attempt == 1:
        await _sleep(seconds)
    record("end")


@app.task(name="guarded.until_fixed", retry=AT_ONCE, max_attempts=1)
async def until_fixed(token: str = "") -> None:
    """Fails unless the worker runs with ``$HARNESS_FIXED=1``: the bug a person fixes."""
    record("start")
    if os.environ.get("HARNESS_FIXED") != "1":
        raise RuntimeError("not fixed yet")
    record("end")


# The same function under a second name, for requeueing by task name.
until_fixed_too = app.task(name="guarded.until_fixed_too", retry=AT_ONCE, max_attempts=1)(
    until_fixed.fn
)

# -- workflows: each step's side effect is a ledger line ``step:<name>``, so a step that
# -- ran twice shows. The first claim of a job can stop its own worker (SIGSTOP) at a
# -- known point; a later claim can wait at a gate, a file the test creates. ``step_tx``
# -- steps insert into ``wf_effects (job_id bigint, claim bigint)``, which the test makes.


def _claim() -> int:
    """The claim running now (1 for a job's first run; a suspension's run adds one)."""
    run = asyncq.current_job().workflow
    assert run is not None
    return run.job.claim


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


async def _gate(path: str) -> None:
    """Wait until the file ``path`` exists: the test opens the gate."""
    record("gate")
    gate = anyio.Path(path)
    while not await gate.exists():  # noqa: ASYNC110 - a file of another process's
        await asyncio.sleep(0.02)


def _effect(name: str, stop: bool = False) -> dict[str, int]:
    record(f"step:{name}")
    if stop:
        _stop_self()
    return {"claim": _claim()}


async def _book(conn: Any, stop: bool = False) -> dict[str, int]:
    """A ``step_tx`` step: its row in ``wf_effects`` commits with its checkpoint."""
    job = asyncq.current_job()
    await conn.execute("INSERT INTO wf_effects (job_id, claim) VALUES (%s, %s)", (job.id, _claim()))
    record("step:book")
    if stop:
        _stop_self()
    return {"claim": _claim()}


@app.task
async def wf_steps(stop_in: str = "", gate: str = "") -> list[object]:
    """Steps a, b and c. The first claim stops its worker inside step ``stop_in`` (after
    its side effect, before its checkpoint), or waits at ``gate`` between a and b."""
    record("start")
    ctx = asyncq.current_job()
    first = _claim() == 1
    a = await ctx.step("a", _effect, "a", first and stop_in == "a")
    if gate and first:
        await _gate(gate)
    b = await ctx.step("b", _effect, "b", first and stop_in == "b")
    c = await ctx.step("c", _effect, "c", first and stop_in == "c")
    record("end")
    return [a, b, c]


@app.task
async def wf_step_tx(stop_in: bool = False, gate: str = "") -> object:
    """One ``step_tx``: the first claim stops its worker inside it (``stop_in``: its row
    inserted, not committed) or waits at ``gate`` before it."""
    record("start")
    first = _claim() == 1
    if gate and first:
        await _gate(gate)
    booked = await asyncq.current_job().step_tx("book", _book, first and stop_in)
    record("end")
    return booked


@app.task
async def wf_child(n: int, gate: str = "") -> int:
    record("start")
    if gate:
        await _gate(gate)
    record("end")
    return n


@app.task
async def wf_parent(
    gates: list[str], queue: str = "", stop: bool = False, sleep: float = 0.0
) -> list[object]:
    """Spawns one ``wf_child`` per entry of ``gates`` (its gate, or ""), in ``queue``,
    then gathers them. The first claim stops its worker between the spawn and the
    gather's suspension (``stop``), or sleeps ``sleep`` seconds there first (durably)."""
    record("start")
    ctx = asyncq.current_job()
    child = wf_child.options(queue=queue) if queue else wf_child
    ids = await ctx.spawn_many(child, [{"n": n, "gate": g} for n, g in enumerate(gates)])
    record("spawned")
    if stop and _claim() == 1:
        _stop_self()
    if sleep:
        await ctx.sleep(sleep)
    results = await ctx.gather(ids)
    record("end")
    return results


@app.task
async def wf_sleeper(seconds: float) -> list[object]:
    """Step a, a durable sleep, step b."""
    record("start")
    ctx = asyncq.current_job()
    a = await ctx.step("a", _effect, "a")
    await ctx.sleep(seconds)
    b = await ctx.step("b", _effect, "b")
    record("end")
    return [a, b]


@app.task
async def wf_fenced(kind: str, gate: str, key: str = "") -> object:
    """One write of kind ``kind`` (step, step_tx, sleep, wait, spawn). The first claim
    stops its worker just before the write (inside the step, after its side effect, for
    the steps); any other claim waits at ``gate`` first, then writes."""
    record("start")
    ctx = asyncq.current_job()
    first = _claim() == 1
    if not first:
        await _gate(gate)
    if kind == "step":
        done: object = await ctx.step("x", _effect, "x", first)
    elif kind == "step_tx":
        done = await ctx.step_tx("book", _book, first)
    else:
        if first:
            _stop_self()
        if kind == "sleep":
            await ctx.sleep(0.2)
            done = "slept"
        elif kind == "wait":
            done = await ctx.wait_for_event(key, timeout=120)
        else:
            done = await ctx.gather(await ctx.spawn_many(wf_child, [{"n": 1}, {"n": 2}]))
    record("end")
    return done


# -- what operators look at -------------------------------------------------------------

_log = logging.getLogger("harness.reporting")


@app.task(retry=AT_ONCE)
async def reporting(fail_first: int = 0, gate: str = "") -> str:
    """Logs a line, reports progress and fails its first ``fail_first`` attempts; with
    ``gate``, waits for that file to exist before it ends (its progress is on the row)."""
    record("start")
    ctx = asyncq.current_job()
    _log.info("attempt %d starts", ctx.attempt)
    ctx.progress(0.5, f"half of attempt {ctx.attempt}")
    if gate:
        await _gate(gate)
    if ctx.attempt <= fail_first:
        raise LookupError(f"attempt {ctx.attempt} fails on purpose")
    ctx.progress(1.0, "done")
    record("end")
    return "reported"


APP = "tests.harness.app:app"


@app.task
def sleep_in_thread(seconds: float) -> None:
    """A plain def that sleeps without looking at ``stop_requested``: nothing stops it."""
    record("start")
    time.sleep(seconds)
    record("end")


NOOP, SLEEP, WORK, FAIL = noop.name, sleep.name, work.name, fail.name
SLEEP_BY_ATTEMPT, FAIL_SLOWLY_RETRIED = sleep_by_attempt.name, fail_slowly_retried.name
KILL_OWN_WORKER, FREEZE_THEN, STUBBORN = kill_own_worker.name, freeze_then.name, stubborn.name
HOLD_CONNECTION, TAKES = hold_connection.name, takes.name
SLEEP_IN_THREAD = sleep_in_thread.name
SLOW_ECHO = slow_echo.name
REPORTING = reporting.name
ECHO, UNSTORABLE = echo.name, unstorable.name
RAISE_SYSTEM_EXIT, RAISE_KEYBOARD_INTERRUPT = raise_system_exit.name, raise_keyboard_interrupt.name
GUARDED = [name for name in app.tasks if name.startswith("guarded.")]
WF_STEPS, WF_STEP_TX, WF_CHILD, WF_PARENT = (
    wf_steps.name,
    wf_step_tx.name,
    wf_child.name,
    wf_parent.name,
)
WF_SLEEPER, WF_FENCED = wf_sleeper.name, wf_fenced.name
