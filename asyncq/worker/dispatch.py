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

The self-fence: each held attempt remembers when the claim or the last renewal that
succeeded was sent (`Attempt.renewed`, on the loop's monotonic clock). The database locked
the row no earlier than that, so no rescuer can take the job back before a lease has
passed since. An attempt not renewed for `FENCE_AFTER` of the lease (the worker cannot
reach the database, or was frozen) is stopped and given up like a lost one, before another
worker may claim it: one job never runs on two hosts at once, beyond what the task does
after its cancellation. One timer, set for the earliest such moment, does it, on the
loop, whatever the heartbeat's calls are waiting for. What it cannot stop: code that
blocks the loop (the timer fires late) and work handed to a thread
(``asyncio.to_thread``: the attempt is cancelled, the thread runs on).

While short attempts run, the tick (`asyncq.worker.tick`) wakes the loop every half
millisecond (on uvloop, just after each millisecond), so that the tasks' own timers fire
on time.

Shutdown (`stop`): running attempts get the grace period to end; the rest are stopped
and handed back; an attempt that does not end within `STOP_DEADLINE` of that (a task
that swallows cancellation) is left running, to its lease, and the worker goes on
without it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter

import anyio

from asyncq.job import Job, running_job
from asyncq.worker.executor import Executor, RunnableTask
from asyncq.worker.handoff import Handoff
from asyncq.worker.observer import Observer
from asyncq.worker.outcomes import DONE, Kind, Outcome, Stop, decide
from asyncq.worker.settings import FENCE_AFTER, STOP_DEADLINE
from asyncq.worker.slots import Slots
from asyncq.worker.tick import Tick

logger = logging.getLogger(__name__)

# The outcome of nearly every attempt, done with nothing to store, is made by tuple's
# own __new__ with every field in order (Outcome's is Python code).
new_tuple = tuple.__new__

Notes = Mapping[tuple[int, int], object]
"""Attempts that leave something beside their outcome, by (job id, claim): what their
tasks logged, the progress they reported."""


def _no_notes(job: Job) -> tuple[str | None, str | None]:
    return None, None


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
    renewed: float = 0.0  # the loop's time when its claim or last good renewal was sent


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
        lease: float,
        unknown: Callable[[str], None] = lambda task_name: None,
        logged: Notes | None = None,
        reported: Notes | None = None,
        take_notes: Callable[[Job], tuple[str | None, str | None]] = _no_notes,
    ) -> None:
        self.concurrency = concurrency
        # What the attempts logged and the progress they reported, taken as each ends
        # (`take_notes`: the JSON of both), looked for only while there is some.
        self.logged: Notes = {} if logged is None else logged
        self.reported: Notes = {} if reported is None else reported
        self.take_notes = take_notes
        self.unknown = unknown  # told the name of a task this worker does not know
        self.tasks = tasks
        self.executor = executor
        self.slots = slots
        self.submit = submit
        self.observer = observer
        # Observers with a hook around attempts: without one, an attempt calls nothing more.
        self._watched = observer.watches_attempts
        self.held: dict[int, Attempt] = {}
        self._queue: Handoff[Attempt | None] = Handoff()
        self._runners: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()  # set as attempts end, while stopping
        self._stopping = False
        self._closed = False
        self.fence_after = lease * FENCE_AFTER
        self._fence: asyncio.TimerHandle | None = None
        self.tick = Tick(slots)
        # Read once, by start(): asyncio.get_running_loop() and current_task() make a
        # system call each (getpid, before Python 3.12), which per job cost more than all
        # of the dispatcher's own bookkeeping.
        self._loop: asyncio.AbstractEventLoop

    def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.tick.start()
        for _ in range(self.concurrency):
            runner = loop.create_task(self._runner())
            self._runners.add(runner)
            runner.add_done_callback(self._runner_ended)

    # -- attempts ---------------------------------------------------------------------

    def hold(self, job: Job, sent: float | None = None, *, first: bool = False) -> None:
        """Run ``job``, just claimed: `hold_many` of one."""
        self.hold_many((job,), sent, first=first)

    def hold_many(
        self, jobs: Sequence[Job], sent: float | None = None, *, first: bool = False
    ) -> None:
        """Run ``jobs``, claimed by one statement sent at ``sent`` (the loop's time; None:
        now), in their order (when the runners are all busy, they wait for one);
        ``first``: before the jobs waiting (a limited task's jobs, claimed for free
        runners)."""
        held = self.held
        now = self._loop.time()
        renewed = now if sent is None else sent
        attempts = []
        for job in jobs:
            earlier = held.get(job.id)
            if earlier is not None:
                # Claimed again here (reaped while this worker was frozen, say): the earlier
                # claim is gone, and with it anything its attempt would write.
                self.lose(earlier, f"claimed again here as attempt {job.attempt}")
            attempt = Attempt(job, renewed=renewed)
            held[job.id] = attempt
            attempts.append(attempt)
        if first:
            self._queue.put_first_many(attempts)
        else:
            self._queue.put_many(attempts)
        due = renewed + self.fence_after
        if now >= due:  # a claim that took most of a lease: never run its jobs
            for attempt in attempts:
                self._fenced(attempt, now)
        elif self._fence is None or self._fence.when() > due:
            self._fence_at(due)

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
        """A lost lease: write nothing more for this claim, stop its attempt, stop
        renewing it."""
        if self._give_up(attempt):
            self.observer.lease_lost(attempt.job, why)

    def _give_up(self, attempt: Attempt) -> bool:
        """The one path for a lease lost or given up (the self-fence); False if it was
        already."""
        if attempt.stop is Stop.LEASE_LOST:
            return False
        self.stop_attempt(attempt, Stop.LEASE_LOST)
        attempt.stop = Stop.LEASE_LOST
        self.forget(attempt)
        return True

    def let_go(self, job: Job) -> None:
        """``job``'s attempt suspended it (a sleep, a wait): its row is written, so it is
        held no more (nor renewed), though the attempt has yet to unwind."""
        attempt = self.held.get(job.id)
        if attempt is not None and attempt.job.claim == job.claim:
            del self.held[job.id]

    def lost_by_attempt(self, job: Job, why: str) -> None:
        """A write of ``job``'s own attempt found its lease lost: the attempt ends by itself
        (`asyncq.workflow.LeaseLost`), so its runner is not cancelled."""
        attempt = self.held.get(job.id)
        if attempt is not None and attempt.job.claim == job.claim:
            if attempt.stop is not Stop.LEASE_LOST:
                attempt.stop = Stop.LEASE_LOST
                self.observer.lease_lost(job, why)
            self.forget(attempt)

    def renewed(self, attempt: Attempt, sent: float) -> None:
        """A renewal of ``attempt``'s lease sent at ``sent`` (the loop's time) succeeded."""
        if sent > attempt.renewed:
            attempt.renewed = sent
        # The timer stays: when it fires, it sets itself again for the earliest attempt.

    def _fence_at(self, when: float) -> None:
        timer = self._fence
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._fence = self._loop.call_at(when, self._check_fence)

    def _check_fence(self) -> None:
        """Stop every attempt whose lease has not been renewed for `fence_after`."""
        self._fence = None
        now = self._loop.time()
        earliest: float | None = None
        for attempt in list(self.held.values()):
            if attempt.state is State.ENDED or self._fenced(attempt, now):
                continue  # an ended one has nothing to stop; the write of its outcome is fenced
            due = attempt.renewed + self.fence_after
            if earliest is None or due < earliest:
                earliest = due
        if earliest is not None and not self._closed:
            self._fence_at(earliest)

    def _fenced(self, attempt: Attempt, now: float) -> bool:
        """Stop ``attempt`` if its lease has not been renewed for `fence_after`."""
        if now < attempt.renewed + self.fence_after:
            return False
        if self._give_up(attempt):
            self.observer.fenced(attempt.job, now - attempt.renewed)
        return True

    def forget(self, attempt: Attempt) -> None:
        """Stop holding ``attempt`` (a later claim of the same job held here stays)."""
        if self.held.get(attempt.job.id) is attempt:
            del self.held[attempt.job.id]

    def written(self, jobs: Sequence[Job]) -> None:
        """The outcomes of ``jobs`` are written (or can never be): stop holding those
        claims."""
        held = self.held
        for job in jobs:
            attempt = held.get(job.id)
            if attempt is not None and attempt.job.claim == job.claim:
                del held[job.id]

    def attempts(self) -> list[Attempt]:
        return list(self.held.values())

    def running_now(self, job: Job) -> bool:
        """Whether the attempt of ``job`` by its claim runs here now."""
        attempt = self.held.get(job.id)
        return (
            attempt is not None
            and attempt.job.claim == job.claim
            and attempt.state is State.RUNNING
        )

    def _noted(self, job: Job, outcome: Outcome | None) -> Outcome | None:
        """``outcome`` with what its attempt logged and the progress it reported last."""
        logs, progress = self.take_notes(job)
        if outcome is None or (logs is None and progress is None) or outcome.kind is Kind.SUSPEND:
            return outcome  # nothing to write (a suspension wrote its own row already)
        return outcome._replace(logs=logs, progress=progress)

    # -- runners ----------------------------------------------------------------------

    async def _runner(self) -> None:
        # One coroutine runs attempt after attempt: what an attempt costs the worker is
        # paid per job, so the attempt is run here rather than in a coroutine of its own,
        # and a claimed attempt already waiting is taken without suspending.
        queue = self._queue
        waiting = queue.items
        take = queue.take
        runner = asyncio.current_task()
        assert runner is not None
        tasks, executor, slots, observer = self.tasks, self.executor, self.slots, self.observer
        attempt_of, worker, gateway = executor.attempt, executor.worker, executor.gateway
        set_job, reset_job = running_job.set, running_job.reset
        tick = self.tick
        loop = self._loop
        logged, reported = self.logged, self.reported
        running, ended_state = State.RUNNING, State.ENDED  # looked up once, as DONE is
        while not self._closed:
            attempt = take() if waiting else await queue.get()
            if attempt is None:
                return
            job = attempt.job
            task = tasks.get(job.task_name)
            if task is None:
                self.unknown(job.task_name)  # its attempt gives it back
            ended = observer.running(job) if self._watched else None
            stop = attempt.stop
            if stop is not None:  # stopped before it started
                error: BaseException | None = asyncio.CancelledError()
                outcome = decide(job, task, error=error, stop=stop)
            else:
                attempt.runner = runner
                attempt.state = running
                if tick.resting and task is not None and not task.blocking:
                    tick.arm()  # a task in a thread has no timers on the loop
                timer = None
                if task is not None and task.timeout is not None:
                    timer = loop.call_later(task.timeout, self.stop_attempt, attempt, Stop.TIMEOUT)
                result = error = None
                started = perf_counter()  # the loop's clock may tick in milliseconds (uvloop)
                token = set_job((job, worker, None, gateway))
                try:
                    # The task's coroutine awaited here, in the runner's own frame: one
                    # frame fewer to resume each time the task does.
                    result = await attempt_of(job, task)
                except BaseException as exc:  # noqa: BLE001 - a job's failure must never stop the worker
                    error = exc  # CancelledError included: the worker's stop, or the task's own
                finally:
                    reset_job(token)
                    attempt.runner = None
                    if timer is not None:
                        timer.cancel()
                    # Take back the worker's cancellation (delivered, or swallowed by the
                    # task), and any the task left behind, so that none reaches the runner's
                    # next attempt.
                    while runner.cancelling():
                        runner.uncancel()
                    attempt.cancels = 0
                duration = perf_counter() - started
                slots.ran(duration)
                stop = attempt.stop
                if error is None and result is None and stop is None:
                    outcome = new_tuple(
                        Outcome, (job, DONE, None, 0.0, None, None, duration, None, None)
                    )
                else:
                    outcome = decide(
                        job, task, result=result, error=error, stop=stop, duration=duration
                    )
            if ended is not None:
                ended(outcome, error, stop)
            attempt.state = ended_state
            if logged or reported:
                outcome = self._noted(job, outcome)
            if self._stopping:
                self._ended.set()
            if outcome is None or self._closed:
                slots.give_back(to_write=False)
                self.forget(attempt)
            else:
                slots.give_back(to_write=True)
                self.submit(outcome)

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
        self._stopping = True
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
        self.tick.close()
        if self._fence is not None:
            self._fence.cancel()
            self._fence = None
        for _ in range(len(self._runners)):
            self._queue.put(None)
        for attempt in stubborn:
            self.forget(attempt)
        if stubborn:
            self.observer.left_running([a.job for a in stubborn])
        return [a.job for a in stubborn]
