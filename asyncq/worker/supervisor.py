"""The supervisor: starts the worker's services in one task group and runs shutdown.

Shutdown: stop claiming, let running jobs finish within the grace period,
cancel what is left and hand it back to the queue (the attempt not counted),
write every outcome, close. A second SIGTERM/SIGINT exits at once; the
lease then brings those jobs back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from asyncq import migrate
from asyncq.errors import ConfigurationError, SchemaNotMigrated
from asyncq.job import Job
from asyncq.pools import reconnect_options
from asyncq.store import Store
from asyncq.task import Task, validate_name
from asyncq.worker.completer import Completer
from asyncq.worker.executor import Outcome, execute
from asyncq.worker.heartbeat import Heartbeat
from asyncq.worker.listener import Listener
from asyncq.worker.producer import Producer
from asyncq.worker.reaper import Reaper
from asyncq.worker.state import Held, Runner, Slots, Wakeup

logger = logging.getLogger(__name__)

CLOSE_DEADLINE = 10.0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSettings:
    queues: tuple[str, ...] | None = None
    concurrency: int = 10
    batch_size: int = 10
    lease: float = 30.0
    grace: float = 20.0
    poll_interval: float = 1.0
    reap_interval: float = 2.0
    retention: timedelta = timedelta(days=7)
    listener_health_interval: float = 10.0
    listener_health_timeout: float = 5.0
    drain: bool = False
    handle_signals: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStats:
    """What a worker did, returned when it stops."""

    worker: str
    claimed: int
    done: int
    failed_attempts: int
    released: int


class Worker:
    def __init__(
        self,
        *,
        worker_id: str,
        tasks: Mapping[str, Task[Any, Any]],
        pool: AsyncConnectionPool,
        store: Store,
        conninfo: str,
        connect_kwargs: Mapping[str, Any],
        settings: WorkerSettings,
    ) -> None:
        self.id = worker_id
        self.tasks = tasks
        self.pool = pool
        self.store = store
        self.conninfo = conninfo
        self.connect_kwargs = dict(connect_kwargs)
        self.settings = settings
        self.held: dict[int, Held] = {}
        self.slots = Slots(settings.concurrency)
        self.wakeup = Wakeup()
        self._unfinished: list[Job] = []
        self._released = 0
        self._stopping = False
        self._producer_scope: anyio.CancelScope | None = None
        self._signals = 0
        self._to_run: asyncio.Queue[Held | None] = asyncio.Queue()

    # -- control --------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period to finish."""
        if self._stopping:
            return
        self._stopping = True
        logger.info(
            "stopping: no new claims; waiting up to %.0fs for %d running jobs",
            self.settings.grace,
            self.slots.used,
            extra={"action": "worker_stopping"},
        )
        if self._producer_scope is not None:
            self._producer_scope.cancel()

    # -- run ------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        schema = await self._check_schema()
        control = AsyncConnectionPool(
            self.conninfo,
            min_size=1,
            max_size=2,
            kwargs=self.connect_kwargs,
            configure=_configure_control,
            open=False,
            name=f"asyncq-control-{self.id}",
            **reconnect_options(),
        )
        await control.open(wait=False)
        settings = self.settings
        lease = timedelta(seconds=settings.lease)
        completer = Completer(
            pool=self.pool, store=self.store, worker=self.id, on_written=self._written
        )
        self._completer = completer
        producer = Producer(
            pool=self.pool,
            store=self.store,
            worker=self.id,
            queues=settings.queues,
            lease=lease,
            batch_size=settings.batch_size,
            slots=self.slots,
            wakeup=self.wakeup,
            poll_interval=settings.poll_interval,
            start_job=self._start_job,
            is_idle=lambda: not self.held,
            drain=settings.drain,
            claim_loops=claim_loops(settings, self.pool),
        )
        listener = Listener(
            connect=lambda: psycopg.AsyncConnection.connect(self.conninfo, **self.connect_kwargs),
            channel=f"asyncq.{schema}",
            queues=settings.queues,
            wakeup=self.wakeup,
            health_interval=settings.listener_health_interval,
            health_timeout=settings.listener_health_timeout,
        )
        heartbeat = Heartbeat(
            pool=control,
            store=self.store,
            worker=self.id,
            held=self.held,
            interval=settings.lease / 4,
        )
        reaper = Reaper(
            pool=control,
            store=self.store,
            schema=schema,
            interval=settings.reap_interval,
            retention=settings.retention,
        )
        logger.info(
            "worker %s started: queues=%s concurrency=%d batch_size=%d lease=%.0fs",
            self.id,
            ",".join(settings.queues) if settings.queues else "*",
            settings.concurrency,
            settings.batch_size,
            settings.lease,
            extra={"action": "worker_started", "worker": self.id},
        )
        restore = self._install_signal_handlers() if settings.handle_signals else None
        try:
            async with anyio.create_task_group() as services:
                await services.start(listener.run)
                await services.start(heartbeat.run)
                await services.start(reaper.run)
                async with anyio.create_task_group() as writing:
                    await writing.start(completer.run)
                    try:
                        await self._claim_and_run(producer)
                    finally:
                        with anyio.move_on_after(CLOSE_DEADLINE, shield=True):
                            await self._hand_back()
                        completer.close()
                        # Outcomes not written by then are brought back by their lease.
                        writing.cancel_scope.deadline = anyio.current_time() + CLOSE_DEADLINE
                services.cancel_scope.cancel()
        finally:
            if restore:
                restore()
            with anyio.move_on_after(CLOSE_DEADLINE, shield=True):
                await control.close()
        stats = WorkerStats(
            worker=self.id,
            claimed=producer.claimed,
            done=completer.done,
            failed_attempts=completer.failed_attempts,
            released=self._released,
        )
        logger.info(
            "worker %s stopped: %d claimed, %d done, %d failed attempts, %d handed back",
            self.id,
            stats.claimed,
            stats.done,
            stats.failed_attempts,
            stats.released,
            extra={"action": "worker_stopped", "worker": self.id},
        )
        return stats

    async def _check_schema(self) -> str:
        """The schema holding the jobs table, at this asyncq's version."""
        try:
            async with self.pool.connection() as conn:
                schema = await self.store.find_jobs_table(conn)
                if schema is None:
                    where = f"schema {self.store.schema!r}" if self.store.schema else "schema"
                    raise SchemaNotMigrated(
                        f"there is no asyncq_jobs table in this database's {where}:"
                        " run `asyncq migrate MODULE:APP` (or `await app.migrate()`) first"
                    )
                missing = await self.store.missing_worker_privileges(conn, schema)
                if missing:
                    user = conn.info.user
                    raise ConfigurationError(
                        f"role {user!r} cannot run a worker on {schema}.asyncq_jobs; it lacks"
                        f" {', '.join(missing)} (docs/least-privilege.md lists the grants)"
                    )
                await migrate.check(conn, schema)
        except PoolTimeout as exc:
            raise psycopg.OperationalError(str(exc)) from exc
        return schema

    async def _claim_and_run(self, producer: Producer) -> None:
        # One runner per slot, fed claimed jobs through a queue: cheaper than a task per job.
        async with anyio.create_task_group() as runners:
            for _ in range(self.settings.concurrency):
                runners.start_soon(self._runner)
            if not self._stopping:
                with anyio.CancelScope() as self._producer_scope:
                    await producer.run()
            with anyio.move_on_after(self.settings.grace):
                await self.slots.wait_free(self.slots.total)
            still = [h for h in self.held.values() if h.executing]
            if still:
                logger.warning(
                    "grace period over: cancelling %d running jobs and handing them back",
                    len(still),
                    extra={"action": "jobs_cancelled"},
                )
            for held in still:
                held.cancel()
            for _ in range(self.settings.concurrency):
                self._to_run.put_nowait(None)

    def _start_job(self, job: Job) -> None:
        earlier = self.held.get(job.id)
        if earlier is not None and earlier.executing and not earlier.lost:
            # Claimed again here (reaped while this worker was frozen, say): the earlier
            # attempt's lease is gone, and its result would be dropped.
            earlier.lost = True
            earlier.cancel()
            logger.warning(
                "job %d: lease lost during attempt %d (claimed again here as attempt %d);"
                " cancelling the earlier attempt",
                job.id,
                earlier.job.attempt,
                job.attempt,
                extra={"action": "lease_lost", "job_id": job.id},
            )
        held = Held(job)
        self.held[job.id] = held
        self._to_run.put_nowait(held)  # a claim takes no more jobs than there are free runners

    async def _runner(self) -> None:
        runner = Runner()
        while True:
            # A scope lasts until a job in it is cancelled (lease lost, grace over), not a
            # scope per job: entering one costs more than running a no-op job.
            with runner.scope:
                while True:
                    held = await self._to_run.get()
                    if held is None:
                        return
                    await self._run_one(held, runner)
            runner.scope = anyio.CancelScope()

    async def _run_one(self, held: Held, runner: Runner) -> None:
        outcome: Outcome | None = None
        held.runner = runner
        runner.current = held
        try:
            if not held.cancelled:
                outcome = await execute(held.job, self.tasks, self.id)
        finally:
            runner.current = None
            held.executing = False
            to_write = outcome is not None and not held.lost
            self.slots.give_back(to_write=to_write)
            if held.lost:
                self._forget(held.job)
            elif outcome is not None:
                self._completer.submit(outcome)
            else:
                self._unfinished.append(held.job)

    def _written(self, job: Job) -> None:
        self.slots.written()
        self._forget(job)

    def _forget(self, job: Job) -> None:
        """Stop holding this attempt of the job; a later attempt claimed here stays held."""
        held = self.held.get(job.id)
        if held is not None and held.job.attempt == job.attempt:
            del self.held[job.id]

    async def _hand_back(self) -> None:
        jobs, self._unfinished = self._unfinished, []
        if not jobs:
            return
        try:
            async with self.pool.connection() as conn:
                released = await self.store.release(
                    conn,
                    worker=self.id,
                    ids=[j.id for j in jobs],
                    attempts=[j.attempt for j in jobs],
                )
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            logger.warning(
                "could not hand back %d jobs (%s); their lease will bring them back",
                len(jobs),
                type(exc).__name__,
                extra={"action": "release_failed"},
            )
            return
        self._released += len(released)
        for job in jobs:
            self._forget(job)
        logger.info(
            "handed back %d unfinished jobs to the queue",
            len(released),
            extra={"action": "jobs_released"},
        )

    # -- signals --------------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        loop = asyncio.get_running_loop()

        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals == 1:
                loop.call_soon_threadsafe(self.stop)
            else:
                os.write(2, b"asyncq: second signal, exiting at once\n")
                os._exit(1)

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def claim_loops(settings: WorkerSettings, pool: AsyncConnectionPool) -> int:
    """Two claims in flight when the slots hold two batches and the pool can spare the
    connections (two claims, the outcome writes, and one for the jobs themselves)."""
    return 2 if settings.concurrency >= 2 * settings.batch_size and pool.max_size >= 4 else 1


async def _configure_control(conn: psycopg.AsyncConnection[Any]) -> None:
    # A reaper frozen inside its transaction (SIGSTOP, a paused VM) must not hold the
    # reaper lock, and its row locks, for longer than this.
    await conn.execute("SET idle_in_transaction_session_timeout = '5s'")


def settings_from(
    *,
    queues: Sequence[str] | None,
    concurrency: int,
    batch_size: int | None,
    lease: float,
    **rest: Any,
) -> WorkerSettings:
    """Validated settings; `ConfigurationError` names the bad option."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigurationError(f"concurrency must be an int >= 1, not {concurrency!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigurationError(f"batch_size must be an int >= 1, not {batch_size!r}")
    if not lease > 0:
        raise ConfigurationError(f"lease must be > 0 seconds, not {lease!r}")
    for name in ("grace", "poll_interval", "reap_interval"):
        if name in rest and not rest[name] >= 0:
            raise ConfigurationError(f"{name} must be >= 0 seconds, not {rest[name]!r}")
    for name in ("listener_health_interval", "listener_health_timeout"):
        if name in rest and not rest[name] > 0:
            raise ConfigurationError(f"{name} must be > 0 seconds, not {rest[name]!r}")
    if isinstance(queues, str):
        queues = [queues]  # one queue name, not a sequence of one-letter names
    for queue in queues or ():
        validate_name("queue", queue)
    return WorkerSettings(
        queues=tuple(queues) if queues else None,
        concurrency=concurrency,
        batch_size=batch_size or min(concurrency, 100),
        lease=lease,
        **rest,
    )
