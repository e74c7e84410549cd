"""The supervisor: checks the database, opens the worker's own pool, starts the services
from a list in one task group, runs the claim loops, and shuts down in order.

Shutdown (a signal, the end of a drain, or the caller's cancellation): stop claiming;
let running jobs finish within the grace period (none when the caller cancels); stop
and hand back what is left; leave to their lease the attempts that do not stop; write
every outcome; stop the services; close the pool. A second SIGTERM/SIGINT exits at
once: the lease then brings those jobs back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from types import FrameType
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import asyncq
from asyncq import migrate, pools
from asyncq.errors import ConfigurationError, PreparedStatementsRefused, SchemaNotMigrated
from asyncq.job import Job
from asyncq.limits import ClaimLimits, TaskLimits
from asyncq.pools import reconnect_options
from asyncq.schedule import Schedule
from asyncq.store import REFUSED_PREPARED, Store, WorkerFacts, asyncq_error
from asyncq.worker.aborts import AbortPoll
from asyncq.worker.checkpoints import Checkpoints
from asyncq.worker.completer import Completer
from asyncq.worker.dispatch import Dispatcher, State
from asyncq.worker.executor import Executor, Middleware, RunnableTask
from asyncq.worker.heartbeat import Heartbeat
from asyncq.worker.limiter import Limiter
from asyncq.worker.listener import Listener
from asyncq.worker.logcapture import LogCapture, level_of
from asyncq.worker.maintenance import Maintainer
from asyncq.worker.maintenance.pruner import Pruner
from asyncq.worker.maintenance.rescuer import Rescuer
from asyncq.worker.maintenance.samples import QueueSampler
from asyncq.worker.maintenance.scheduler import Scheduler
from asyncq.worker.maintenance.unknown import UnknownTasks
from asyncq.worker.maintenance.wakeups import LostWakeups
from asyncq.worker.maintenance.workers import DeadWorkers
from asyncq.worker.observer import (
    Counts,
    LogObserver,
    Observer,
    Observers,
    WorkerInfo,
    WorkerStats,
)
from asyncq.worker.pool_check import PoolCheck
from asyncq.worker.presence import Presence
from asyncq.worker.producer import Producer
from asyncq.worker.services import Service, start_all
from asyncq.worker.settings import WorkerSettings
from asyncq.worker.slots import Slots
from asyncq.worker.sweep import Sweep
from asyncq.worker.threads import Threads
from asyncq.worker.waker import Waker
from asyncq.worker.wakeup import DueTimes, Wakeup

logger = logging.getLogger("asyncq.worker")

CLOSE_DEADLINE = 10.0
LIMITS_RECHECK = 60.0  # seconds between reads of the limits kept in the database, told or not


class Worker:
    def __init__(
        self,
        *,
        worker_id: str,
        tasks: Mapping[str, RunnableTask],
        app_pool: AsyncConnectionPool,
        store: Store,
        conninfo: str,
        connect_kwargs: Mapping[str, Any],
        listen_conninfo: str | None = None,
        settings: WorkerSettings,
        middleware: Sequence[Middleware] = (),
        observers: Sequence[Observer] = (),
        schedules: Sequence[Schedule] = (),
        limits: ClaimLimits | None = None,
        task_limits: Sequence[tuple[str, str, TaskLimits]] = (),
        rate_limits: bool = True,
    ) -> None:
        self.id = worker_id
        self.limits = limits  # in code: the claims' until the limiter has read the overrides
        self.task_limits = list(task_limits)  # each task's name, queue and limits in code
        self.rate_limits = rate_limits  # False: the claims leave the rate limits out
        self.tasks = tasks
        self.app_pool = app_pool
        self.store = store
        self.conninfo = conninfo
        # Where the LISTEN connection goes; None: no LISTEN, the worker polls.
        self.listen_conninfo = listen_conninfo
        self.connect_kwargs = dict(connect_kwargs)
        self.settings = settings
        self.middleware = middleware
        self.schedules = list(schedules)
        self.counts = Counts()
        self.observer = Observers([LogObserver(), self.counts, *observers])
        self._stopping = False
        self._claiming: anyio.CancelScope | None = None
        self._signals = 0
        self._running: Callable[[], int] = lambda: 0
        self._warmed = 0

    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period to finish."""
        if self._stopping:
            return
        self._stopping = True
        self.observer.stopping(self._running(), self.settings.grace)
        if self._claiming is not None:
            self._claiming.cancel()

    async def run(self) -> WorkerStats:
        settings = self.settings
        loops = claim_loops(settings)
        pool = AsyncConnectionPool(
            self.conninfo,
            min_size=loops + 1,
            # the claim loops, the completer, heartbeat, maintenance, one more (the
            # scheduler's, for the moments a slot is due), two for the workflows'
            # writes (their batched checkpoints, and a job's sleep, wait or children),
            # one for the progress tasks report and the worker's own row; without a
            # LISTEN connection, one for the polled aborts
            max_size=loops + 7 + (self.listen_conninfo is None),
            kwargs=self._kwargs_for("worker"),
            configure=None if self.limits else self._warm_claim,
            open=False,
            name=f"asyncq-worker-{self.id}",
            **reconnect_options(),
        )
        # The pool's first connections are made (and their claim warmed) while the
        # preflight runs on the App's pool.
        await pool.open(wait=False)
        try:
            facts, channel = await self._preflight()
        except BaseException:
            with anyio.move_on_after(CLOSE_DEADLINE, shield=True):
                await pool.close()
            raise
        observer = self.observer
        slots = Slots(settings.concurrency, ahead=settings.prefetch)
        wakeup = Wakeup()
        assert settings.threads is not None
        threads = Threads(settings.threads)

        def written(jobs: Sequence[Job]) -> None:
            slots.written(len(jobs))
            dispatcher.written(jobs)
            if settings.drain and not dispatcher.held:
                # The last outcome is written: each claim loop looks once more, and ends.
                for _ in range(loops):
                    wakeup.set()

        completer = Completer(
            pool=pool,
            store=self.store,
            worker=self.id,
            observer=observer,
            on_written=written,
            storable=_storable_in(facts.server_encoding),
        )
        checkpoints = Checkpoints(
            pool=pool,
            app_pool=lambda: self.app_pool,
            store=self.store,
            worker=self.id,
            observer=observer,
            release=lambda job: dispatcher.let_go(job),
            lost=lambda job, why: dispatcher.lost_by_attempt(job, why),
        )
        capture_level = level_of(settings.log_capture)
        capture = (
            None
            if capture_level is None
            else LogCapture(
                worker=self.id,
                level=capture_level,
                running=lambda job: dispatcher.running_now(job),
            )
        )

        def take_notes(job: Job) -> tuple[str | None, str | None]:
            logs = None if capture is None else capture.take(job)
            return logs, checkpoints.take_progress(job)

        dispatcher = Dispatcher(
            concurrency=settings.concurrency,
            tasks=self.tasks,
            executor=Executor(
                tasks=self.tasks,
                worker=self.id,
                threads=threads,
                middleware=self.middleware,
                gateway=checkpoints,
            ),
            slots=slots,
            submit=completer.submit,
            observer=observer,
            lease=settings.lease,
            unknown=lambda task_name: producer.skip.add(task_name),
            logged=None if capture is None else capture.logs,
            reported=checkpoints.reported,
            take_notes=take_notes,
        )
        self._running = lambda: sum(1 for a in dispatcher.attempts() if a.state is not State.ENDED)
        producer = Producer(
            pool=pool,
            store=self.store,
            worker=self.id,
            queues=settings.queues,
            lease=timedelta(seconds=settings.lease),
            batch_size=settings.batch,
            slots=slots,
            wakeup=wakeup,
            poll_interval=settings.poll_interval,
            hold=dispatcher.hold_many,
            is_idle=lambda: not dispatcher.held,
            drain=settings.drain,
            observer=observer,
            claim_loops=loops,
            limits=self.limits,
            priority_aging=settings.priority_aging,
            completer=completer,
            connect=self._connect_for_a_look,
        )
        limiter = Limiter(
            pool=pool,
            store=self.store,
            tasks=self.task_limits,
            apply=producer.set_limits,
            # Told by the listener of every change, and after every reconnect: the table is
            # read again on a timer only for a notification lost all the same.
            poll_interval=(
                settings.poll_interval
                if self.listen_conninfo is None
                else max(settings.poll_interval, LIMITS_RECHECK)
            ),
            observer=observer,
            rate_limits=self.rate_limits,
            schema=facts.schema,
        )
        waiting_wakeup = Wakeup()
        waiting_due = DueTimes(waiting_wakeup)
        listen_conninfo = self.listen_conninfo
        # A round trip and nothing else: the listener's health check, the sweep's probes.
        round_trip = pools.Pace(settings.listener_health_timeout, first=pools.FLOOR)
        told: Service
        if listen_conninfo is not None:
            told = Listener(
                connect=lambda: psycopg.AsyncConnection.connect(
                    listen_conninfo, **pools.for_dsn(self._kwargs_for("listener"), listen_conninfo)
                ),
                store=self.store,
                channel=channel,
                queues=settings.queues,
                wakeup=wakeup,
                due=DueTimes(wakeup),
                abort=dispatcher.abort,
                waiting_due=waiting_due,
                health_interval=settings.listener_health_interval,
                health_timeout=settings.listener_health_timeout,
                observer=observer,
                pace=round_trip,
                limits_changed=limiter.changed,
            )
        else:  # no LISTEN: the claim loop polls, and cancels are looked for as often
            told = AbortPoll(
                pool=pool,
                store=self.store,
                worker=self.id,
                dispatcher=dispatcher,
                interval=settings.poll_interval,
                observer=observer,
            )
        services: list[Service] = [
            completer,
            checkpoints,
            told,
            limiter,
            Waker(
                pool=pool,
                store=self.store,
                wakeup=waiting_wakeup,
                due=waiting_due,
                # Told by the listener when suspended jobs come due; without one, it looks.
                poll_interval=None if listen_conninfo is not None else settings.poll_interval,
                observer=observer,
            ),
            Heartbeat(
                pool=pool,
                store=self.store,
                worker=self.id,
                dispatcher=dispatcher,
                interval=settings.lease / 4,
                observer=observer,
            ),
            Maintainer(
                pool=pool,
                store=self.store,
                schema=facts.schema,
                pieces=[
                    Rescuer(store=self.store, interval=settings.rescue_interval, observer=observer),
                    LostWakeups(store=self.store, interval=settings.wakeups_interval),
                    UnknownTasks(
                        store=self.store,
                        interval=settings.unknown_interval,
                        grace=timedelta(seconds=settings.unknown_task_grace),
                    ),
                    Pruner(
                        store=self.store,
                        interval=settings.prune_interval,
                        retention=settings.retention,
                    ),
                    DeadWorkers(store=self.store, interval=settings.workers_interval),
                    QueueSampler(
                        store=self.store,
                        interval=settings.samples_interval,
                        retention=settings.samples_retention,
                        observer=observer,
                    ),
                ],
                observer=observer,
            ),
            Presence(
                pool=pool,
                store=self.store,
                worker=self.id,
                version=asyncq.__version__,
                app=settings.app_path,
                queues=settings.queues,
                concurrency=settings.concurrency,
                interval=settings.presence_interval,
                running=lambda: sum(
                    1 for a in dispatcher.held.values() if a.state is State.RUNNING
                ),
                observer=observer,
            ),
            PoolCheck(pool=self.app_pool, observer=observer),
            Sweep(
                pools=[pool, self.app_pool],
                also=[told.check_now] if isinstance(told, Listener) else [],
                pace=round_trip,
            ),
        ]
        if self.schedules:
            services.append(
                Scheduler(
                    pool=pool,
                    store=self.store,
                    schema=facts.schema,
                    schedules=self.schedules,
                    observer=observer,
                )
            )
        restore = self._install_signal_handlers() if settings.handle_signals else None
        left: list[Job] = []
        try:
            async with anyio.create_task_group() as running:
                await start_all(running, services)
                if capture is not None:
                    capture.install()
                dispatcher.start()
                observer.started(
                    WorkerInfo(
                        id=self.id,
                        queues=settings.queues,
                        concurrency=settings.concurrency,
                        batch_size=settings.batch,
                        lease=settings.lease,
                    )
                )
                grace = settings.grace
                try:
                    with anyio.CancelScope() as self._claiming:
                        if not self._stopping:
                            await producer.run()
                except anyio.get_cancelled_exc_class():
                    grace = 0.0  # the caller cancelled the worker: hand back at once
                    raise
                finally:
                    with anyio.CancelScope(shield=True):
                        left = await dispatcher.stop(grace)
                        # Outcomes not written by then are brought back by their lease.
                        with anyio.move_on_after(CLOSE_DEADLINE):
                            await completer.finish()
                    running.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            refused = _refused_prepared(group)
            if refused is None:
                raise
            raise refused from refused.__cause__
        finally:
            if capture is not None:
                capture.remove()
            threads.close()
            if restore:
                restore()
            with anyio.move_on_after(CLOSE_DEADLINE, shield=True):
                await pool.close()
        stats = self.counts.stats(self.id, left_running=len(left))
        observer.stopped(stats)
        return stats

    async def _warm_claim(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Claim nothing on the pool's first connections, one per claim loop: their server
        processes compile the claim function and plan its statement now, while the worker
        starts, rather than in its first claims (several milliseconds each, on the path of
        the first jobs)."""
        if self._warmed >= claim_loops(self.settings):
            return
        self._warmed += 1
        # No table yet, say (the preflight says so), or a broken connection (the pool's).
        with contextlib.suppress(psycopg.Error):
            await self.store.claim(
                conn,
                worker=self.id,
                limit=0,
                queues=self.settings.queues,
                lease=timedelta(seconds=self.settings.lease),
            )

    async def _connect_for_a_look(self) -> psycopg.AsyncConnection[Any]:
        """A new connection, outside the pools, as the worker's pool makes them."""
        return await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs_for("look"))

    def _kwargs_for(self, role: str) -> dict[str, Any]:
        """Connection options whose application_name says what the connection is for:
        ``<name>:<pid>:worker`` (the worker's pool), ``<name>:<pid>:listener``."""
        kwargs = dict(self.connect_kwargs)
        name = kwargs.get("application_name")
        if name:
            kwargs["application_name"] = f"{name}:{role}"
        return kwargs

    async def _preflight(self) -> tuple[WorkerFacts, str]:
        """Where the jobs table is, at this asyncq's version, with the grants a worker
        needs; and its wake-up channel."""
        try:
            async with pools.connection(self.app_pool) as conn:
                facts = await self.store.worker_facts(conn)
                if facts is None:
                    schema = self.store.schema
                    where = f", schema {schema!r}" if schema else ""
                    raise SchemaNotMigrated(
                        f"there is no asyncq_jobs table in database {conn.info.dbname!r}{where}:"
                        " run `asyncq migrate MODULE:APP` (or `await app.migrate()`) first"
                    )
                missing = await self.store.missing_worker_privileges(conn, facts.schema)
                if self.schedules:
                    missing += await self.store.missing_scheduler_privileges(conn, facts.schema)
                if missing:
                    user = conn.info.user
                    raise ConfigurationError(
                        f"role {user!r} cannot run a worker on {facts.schema}.asyncq_jobs; it"
                        f" lacks {', '.join(missing)} (docs/least-privilege.md lists the grants)"
                    )
                await migrate.check(conn, facts.schema)
                if self.limits and not await self.store.has_ready_by_task(conn, facts.schema):
                    logger.warning(
                        "tasks %s have limits, but %s.asyncq_jobs_ready_by_task is missing:"
                        " each claim may read every ready job; `asyncq migrate MODULE:APP`"
                        " with this App makes it",
                        ", ".join(self.limits.names),
                        facts.schema,
                        extra={"action": "index_missing"},
                    )
                channel = await self.store.channel(conn)
        except PoolTimeout as exc:
            raise psycopg.OperationalError(str(exc)) from exc
        return facts, channel

    def _exiting_at_once(self) -> str:
        """The line a second signal leaves on stderr: what becomes of the jobs it runs."""
        running, lease = self._running(), f"{self.settings.lease:g}s"
        if running == 0:
            return "asyncq: second signal, exiting at once (no job was running)\n"
        if running == 1:
            what = f"its running job goes back to the queue when its lease ({lease}) expires"
        else:
            what = (
                f"its {running} running jobs go back to the queue when their lease ({lease})"
                " expires"
            )
        return f"asyncq: second signal, exiting at once; {what}\n"

    def _install_signal_handlers(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        loop = asyncio.get_running_loop()

        def handle(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals == 1:
                loop.call_soon_threadsafe(self.stop)
            else:
                os.write(2, self._exiting_at_once().encode())
                os._exit(1)

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def claim_loops(settings: WorkerSettings) -> int:
    """Two claims in flight when the slots, with the jobs held ahead, hold two batches."""
    room = settings.concurrency + settings.prefetch
    return 2 if room >= 2 * settings.batch else 1


def _storable_in(server_encoding: str) -> Callable[[str], str]:
    """Error text as the database can store it: as it is in UTF-8 (and in SQL_ASCII, which
    stores any bytes), with every character beyond ASCII escaped in other encodings."""
    if server_encoding in ("UTF8", "SQL_ASCII"):
        return lambda text: text
    return lambda text: text.encode("ascii", "backslashreplace").decode("ascii")


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _refused_prepared(group: BaseExceptionGroup[BaseException]) -> PreparedStatementsRefused | None:
    """The one error to stop with when a service met a prepared statement lost or refused
    (PgBouncer in transaction mode): it names the cure, where the group of every service's
    error names none. Its cause is psycopg's error."""
    for leaf in _leaves(group):
        if isinstance(leaf, PreparedStatementsRefused):
            return leaf
        if isinstance(leaf, REFUSED_PREPARED):
            found = asyncq_error(leaf)
            assert isinstance(found, PreparedStatementsRefused)
            found.__cause__ = leaf
            return found
    return None
