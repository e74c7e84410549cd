"""The dispatcher: the runners, and the attempts this worker holds.

A claimed job becomes an `Attempt`, held (its lease renewed by the heartbeat) until
its outcome is written. A fixed set of runner tasks takes attempts from a queue, one
at a time each: cheaper than a task per job.

The worker stops an attempt itself for four reasons (`Stop`): its lease is lost, its
task's timeout runs out, a cancel asks for it, or the grace period of a shutdown is over.
It does so by cancelling the runner while that runner runs exactly that attempt, counts
the cancellation, and takes it back (``Task.uncancel``) when the attempt ends: a stop meant
for one attempt cannot reach the next one its runner takes. A ``CancelledError`` the
worker did not send is the task's own, and fails that attempt like any error.

Shutdown (`stop`): running attempts get the grace period to end; the rest are stopped
and handed back; an attempt that does not end within `STOP_DEADLINE` of that (a task
that swallows cancellation) is left running, to its lease, and the worker goes on
without it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from asyncq.job import Job
from asyncq.worker.executor import Executor, RunnableTask
from asyncq.worker.observer import Observer
from asyncq.worker.outcomes import Outcome, Stop, decide
from asyncq.worker.settings import STOP_DEADLINE
from asyncq.worker.slots import Slots

logger = logging.getLogger(__name__)


class State(enum.Enum):
    READY = "ready"  # claimed; a runner starts it next
    RUNNING = "running"
    ENDED = "ended"  # its outcome waits for its write


@dataclass(slots=True, eq=False)
class Attempt:
    job: Job
    state: State = State.READY
    stop: Stop | None = None  # why the worker stopped it, if it did
    runner: asyncio.Task[None] | None = None  # while RUNNING
    cancels: int = 0  # cancellations sent to its runner, to take back when it ends


class Dispatcher:
    def __init__(
        self,
        *,
        concurrency: int,
        tasks: Mapping[str, RunnableTask],
        executor: Executor,
        slots: Slots,
        submit: Callable[[Outcome], None],
        observer: Observer,
    ) -> None:
        self.concurrency = concurrency
        self.tasks = tasks
        self.executor = executor
        self.slots = slots
        self.submit = submit
        self.observer = observer
        # Observers with a hook around attempts: without one, an attempt calls nothing more.
        self._watched = observer.watches_attempts
        self.held: dict[int, Attempt] = {}
        self._queue: asyncio.Queue[Attempt | None] = asyncio.Queue()
        self._runners: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()
        self._closed = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.concurrency):
            runner = loop.create_task(self._runner())
            self._runners.add(runner)
            runner.add_done_callback(self._runner_ended)

    # -- attempts ---------------------------------------------------------------------

    def hold(self, job: Job) -> None:
        """Run ``job``, just claimed (a claim takes no more jobs than there are free runners)."""
        earlier = self.held.get(job.id)
        if earlier is not None:
            # Claimed again here (reaped while this worker was frozen, say): the earlier
            # claim is gone, and with it anything its attempt would write.
            self.lose(earlier, f"claimed again here as attempt {job.attempt}")
        attempt = Attempt(job)
        self.held[job.id] = attempt
        self._queue.put_nowait(attempt)

    def stop_attempt(self, attempt: Attempt, why: Stop) -> None:
        """Stop ``attempt`` for ``why``: at once if it runs, else before it starts."""
        if attempt.state is State.ENDED or (
            attempt.stop is not None and why is not Stop.LEASE_LOST
        ):
            return
        attempt.stop = why
        runner = attempt.runner
        if attempt.state is State.RUNNING and runner is not None and not attempt.cancels:
            attempt.cancels += 1
            runner.cancel(f"asyncq: {why.value}")

    def abort(self, job_id: int, claim: int | None = None) -> None:
        """A cancel asked to stop ``job_id`` (held by ``claim``, when the message says)."""
        attempt = self.held.get(job_id)
        if attempt is not None and (claim is None or attempt.job.claim == claim):
            self.observer.aborting(attempt.job)
            self.stop_attempt(attempt, Stop.ABORT)

    def lose(self, attempt: Attempt, why: str) -> None:
        """The one path for a lost lease: write nothing more for this claim, stop its
        attempt, stop renewing it."""
        if attempt.stop is Stop.LEASE_LOST:
            return
        self.stop_attempt(attempt, Stop.LEASE_LOST)
        attempt.stop = Stop.LEASE_LOST
        self.observer.lease_lost(attempt.job, why)
        self.forget(attempt)

    def forget(self, attempt: Attempt) -> None:
        """Stop holding ``attempt`` (a later claim of the same job held here stays)."""
        if self.held.get(attempt.job.id) is attempt:
            del self.held[attempt.job.id]

    def written(self, job: Job) -> None:
        """``job``'s outcome is written (or can never be): stop holding that claim."""
        attempt = self.held.get(job.id)
        if attempt is not None and attempt.job.claim == job.claim:
            del self.held[job.id]

    def attempts(self) -> list[Attempt]:
        return list(self.held.values())

    # -- runners ----------------------------------------------------------------------

    async def _runner(self) -> None:
        queue = self._queue
        while not self._closed:
            attempt = await queue.get()
            if attempt is None:
                return
            outcome = await self._run(attempt)
            attempt.state = State.ENDED
            self._ended.set()
            if outcome is None or self._closed:
                self.slots.give_back(to_write=False)
                self.forget(attempt)
            else:
                self.slots.give_back(to_write=True)
                self.submit(outcome)

    async def _run(self, attempt: Attempt) -> Outcome | None:
        job = attempt.job
        task = self.tasks.get(job.task_name)
        ended = self.observer.running(job) if self._watched else None
        if attempt.stop is not None:  # stopped before it started
            cancelled = asyncio.CancelledError()
            outcome = decide(job, task, error=cancelled, stop=attempt.stop)
            if ended is not None:
                ended(outcome, cancelled, attempt.stop)
            return outcome
        runner = asyncio.current_task()
        assert runner is not None
        attempt.runner = runner
        attempt.state = State.RUNNING
        timer = None
        if task is not None and task.timeout is not None:
            timer = asyncio.get_running_loop().call_later(
                task.timeout, self.stop_attempt, attempt, Stop.TIMEOUT
            )
        result = error = None
        started = time.perf_counter()  # the loop's clock may tick in milliseconds (uvloop)
        try:
            result = await self.executor.run(job, task)
        except BaseException as exc:  # noqa: BLE001 - a job's failure must never stop the worker
            error = exc  # CancelledError included: the worker's stop, or the task's own
        finally:
            attempt.runner = None
            if timer is not None:
                timer.cancel()
            # Take back the worker's cancellation (delivered, or swallowed by the task), and
            # any the task left behind, so that none reaches the runner's next attempt.
            while runner.cancelling():
                runner.uncancel()
            attempt.cancels = 0
        duration = time.perf_counter() - started
        stop = attempt.stop
        outcome = decide(job, task, result=result, error=error, stop=stop, duration=duration)
        if ended is not None:
            ended(outcome, error, stop)
        return outcome

    def _runner_ended(self, runner: asyncio.Task[None]) -> None:
        self._runners.discard(runner)
        if not runner.cancelled() and runner.exception() is not None:
            logger.error(
                "a job runner stopped on an error",
                exc_info=runner.exception(),
                extra={"action": "runner_failed"},
            )

    # -- shutdown ---------------------------------------------------------------------

    def _active(self) -> list[Attempt]:
        return [a for a in self.held.values() if a.state is not State.ENDED]

    async def _until_ended(self) -> None:
        while self._active():
            self._ended.clear()
            await self._ended.wait()

    async def stop(self, grace: float) -> list[Job]:
        """Let running attempts end within ``grace`` seconds, stop the rest (their outcome:
        hand back) and close. Returns the jobs of attempts that did not stop."""
        with anyio.move_on_after(grace):
            await self._until_ended()
        active = self._active()
        if active:
            self.observer.stopped_running([a.job for a in active])
            for attempt in active:
                self.stop_attempt(attempt, Stop.SHUTDOWN)
            with anyio.move_on_after(STOP_DEADLINE):
                await self._until_ended()
        stubborn = [a for a in self._active()]
        self._closed = True
        for _ in range(len(self._runners)):
            self._queue.put_nowait(None)
        for attempt in stubborn:
            self.forget(attempt)
        if stubborn:
            self.observer.left_running([a.job for a in stubborn])
        return [a.job for a in stubborn]
