"""The worker's events, and their listeners.

The runtime reports what happens through one `Observer`: a worker starts and stops,
jobs are claimed, attempts run and finish (by their written outcome), leases are lost,
expired jobs are rescued, a schedule fires a slot, a service meets a database error.
Logging (`LogObserver`) and the counts a worker returns (`Counts`, `WorkerStats`) are
listeners; metrics (`asyncq.metrics`) and tracing (`asyncq.tracing`) are more of them,
added without touching the runtime.

`Observer.running` is the one hook around an attempt: it is called in the context the
task runs in, just before the task starts, and what it returns is called there when
the attempt ends. The runtime calls it only for observers that define it
(`watches_attempts`), so a worker without such a listener does nothing more per job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from logging import DEBUG

from asyncq.job import Job
from asyncq.limits import Sourced, describe
from asyncq.worker.outcomes import DONE, Kind, Outcome, Stop

logger = logging.getLogger("asyncq.worker")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStats:
    """What a worker did, returned when it stops."""

    worker: str
    claimed: int
    done: int
    failed_attempts: int
    released: int
    snoozed: int = 0
    cancelled: int = 0
    suspended: int = 0  # attempts that suspended their job (a sleep, a wait)
    given_back: int = 0  # jobs of tasks this worker does not know, given back
    lost: int = 0  # attempts whose lease was lost, the self-fenced included
    left_running: int = 0
    fenced: int = 0  # attempts stopped because their lease could not be renewed in time


@dataclass(frozen=True, slots=True)
class QueueDepth:
    queue: str
    ready: int
    scheduled: int
    running: int
    failed: int
    waiting: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    id: str
    queues: tuple[str, ...] | None
    concurrency: int
    batch_size: int
    lease: float


AttemptEnded = Callable[[Outcome | None, BaseException | None, Stop | None], None]
"""Called when an attempt ends, before its outcome is written: with the outcome (None:
nothing is written, the lease is lost), what the attempt raised (None: it returned),
and why the worker stopped it (None: it did not)."""


class Observer:
    """A listener to a worker's events; each method here does nothing."""

    def started(self, worker: WorkerInfo) -> None:
        pass

    def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
        """``jobs`` were claimed by one statement that took ``seconds``."""

    def queue_depth(self, queues: Sequence[QueueDepth]) -> None:
        """The jobs by queue and state, sampled by one worker at a time."""

    def workers(self, live: int, dead: int) -> None:
        """The workers listed in asyncq_workers: live ones (this one too), and dead ones
        (their rows not refreshed for three beats), seen as this worker refreshed its own."""

    def running(self, job: Job) -> AttemptEnded | None:
        """An attempt of ``job`` starts, in the context its task runs in: a context
        variable set here (a span made current) is seen by the task and by what it calls.
        Returns None, or what to call when the attempt ends, in the same context (to reset
        what was set). Called only when `watches_attempts`; it must not raise."""
        return None

    @property
    def watches_attempts(self) -> bool:
        """Whether `running` does anything: the runtime calls it only then."""
        return type(self).running is not Observer.running

    def finished(self, outcome: Outcome, status: str) -> None:
        """``outcome`` was written; ``status`` is the row's status now."""

    def finished_many(self, outcomes: Sequence[Outcome], status: str) -> None:
        """``outcomes`` were written, and each row's status is ``status`` now: `finished`
        for each, unless the listener takes them at once."""
        for outcome in outcomes:
            self.finished(outcome, status)

    def lease_lost(self, job: Job, why: str) -> None:
        """This worker's claim of ``job`` is gone: it writes nothing more for it."""

    def fenced(self, job: Job, unrenewed: float) -> None:
        """The lease of ``job`` has not been renewed for ``unrenewed`` seconds (since the
        last renewal that succeeded was sent): this worker stops the attempt, before
        another worker may take the job, and writes nothing more for it."""

    def aborting(self, job: Job) -> None:
        """A cancel asked this worker to stop the attempt of ``job`` it runs."""

    def unrecorded(self, outcome: Outcome, error: BaseException) -> None:
        """The database refused ``outcome`` for good; the job's lease will bring it back."""

    def rescued(self, jobs: Mapping[int, str]) -> None:
        """Jobs whose lease expired went back to the queue (or failed): id -> status."""

    def fired(self, schedule: str, slot: datetime, job_id: int) -> None:
        """A schedule's slot made a job."""

    def stopping(self, running: int, grace: float) -> None:
        pass

    def stopped_running(self, jobs: Sequence[Job]) -> None:
        """The grace period is over: these jobs are being cancelled and handed back."""

    def left_running(self, jobs: Sequence[Job]) -> None:
        """These attempts did not stop when cancelled: they are left to their lease."""

    def stopped(self, stats: WorkerStats) -> None:
        pass

    def service_failed(self, service: str, error: BaseException, retry_in: float) -> None:
        """A database call of a service failed (transiently); it tries again later."""

    def listener_connected(self, reconnected: bool) -> None:
        pass

    def limits_changed(self, in_force: Mapping[str, Sourced], *, at_start: bool = False) -> None:
        """The limits the claims enforce changed (an override set or reset at runtime), or
        were read as the worker started (``at_start``): ``in_force`` has every task's,
        with where each comes from."""


class Observers(Observer):
    """Several observers as one."""

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = list(observers)
        self._watching = [o for o in self.observers if o.watches_attempts]

    def started(self, worker: WorkerInfo) -> None:
        for o in self.observers:
            o.started(worker)

    def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
        for o in self.observers:
            o.claimed(jobs, seconds)

    def queue_depth(self, queues: Sequence[QueueDepth]) -> None:
        for o in self.observers:
            o.queue_depth(queues)

    def workers(self, live: int, dead: int) -> None:
        for o in self.observers:
            o.workers(live, dead)

    @property
    def watches_attempts(self) -> bool:
        return bool(self._watching)

    def running(self, job: Job) -> AttemptEnded | None:
        ends = [end for o in self._watching if (end := o.running(job)) is not None]
        if len(ends) <= 1:
            return ends[0] if ends else None

        def ended(outcome: Outcome | None, error: BaseException | None, stop: Stop | None) -> None:
            for end in reversed(ends):  # the last one set is the first reset
                end(outcome, error, stop)

        return ended

    def finished(self, outcome: Outcome, status: str) -> None:
        for o in self.observers:
            o.finished(outcome, status)

    def finished_many(self, outcomes: Sequence[Outcome], status: str) -> None:
        for o in self.observers:
            o.finished_many(outcomes, status)

    def lease_lost(self, job: Job, why: str) -> None:
        for o in self.observers:
            o.lease_lost(job, why)

    def fenced(self, job: Job, unrenewed: float) -> None:
        for o in self.observers:
            o.fenced(job, unrenewed)

    def aborting(self, job: Job) -> None:
        for o in self.observers:
            o.aborting(job)

    def unrecorded(self, outcome: Outcome, error: BaseException) -> None:
        for o in self.observers:
            o.unrecorded(outcome, error)

    def rescued(self, jobs: Mapping[int, str]) -> None:
        for o in self.observers:
            o.rescued(jobs)

    def fired(self, schedule: str, slot: datetime, job_id: int) -> None:
        for o in self.observers:
            o.fired(schedule, slot, job_id)

    def stopping(self, running: int, grace: float) -> None:
        for o in self.observers:
            o.stopping(running, grace)

    def stopped_running(self, jobs: Sequence[Job]) -> None:
        for o in self.observers:
            o.stopped_running(jobs)

    def left_running(self, jobs: Sequence[Job]) -> None:
        for o in self.observers:
            o.left_running(jobs)

    def stopped(self, stats: WorkerStats) -> None:
        for o in self.observers:
            o.stopped(stats)

    def service_failed(self, service: str, error: BaseException, retry_in: float) -> None:
        for o in self.observers:
            o.service_failed(service, error, retry_in)

    def listener_connected(self, reconnected: bool) -> None:
        for o in self.observers:
            o.listener_connected(reconnected)

    def limits_changed(self, in_force: Mapping[str, Sourced], *, at_start: bool = False) -> None:
        for o in self.observers:
            o.limits_changed(in_force, at_start=at_start)


class Counts(Observer):
    """Counts what the worker did, for its `WorkerStats`."""

    def __init__(self) -> None:
        self.claims = 0
        self.by_kind = dict.fromkeys(Kind, 0)
        self.lost = 0
        self.fenced_attempts = 0

    def claimed(self, jobs: Sequence[Job], seconds: float) -> None:
        self.claims += len(jobs)

    def finished(self, outcome: Outcome, status: str) -> None:
        self.by_kind[outcome.kind] += 1

    def finished_many(self, outcomes: Sequence[Outcome], status: str) -> None:
        by_kind = self.by_kind
        for outcome in outcomes:
            by_kind[outcome.kind] += 1

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost += 1

    def fenced(self, job: Job, unrenewed: float) -> None:
        self.lost += 1
        self.fenced_attempts += 1

    def stats(self, worker: str, *, left_running: int = 0) -> WorkerStats:
        kinds = self.by_kind
        return WorkerStats(
            worker=worker,
            claimed=self.claims,
            done=kinds[Kind.DONE],
            failed_attempts=kinds[Kind.RETRY] + kinds[Kind.FAIL],
            released=kinds[Kind.RELEASE],
            snoozed=kinds[Kind.SNOOZE],
            cancelled=kinds[Kind.CANCEL],
            suspended=kinds[Kind.SUSPEND],
            given_back=kinds[Kind.GIVE_BACK],
            lost=self.lost,
            left_running=left_running,
            fenced=self.fenced_attempts,
        )


_FAILED = {"listener": "listener connection lost", "completer": "could not write outcomes"}


def _first_line(text: str | None) -> str:
    return text.splitlines()[0] if text else ""


class LogObserver(Observer):
    """Logs the events, each with a stable ``action``; never job arguments."""

    def started(self, worker: WorkerInfo) -> None:
        logger.info(
            "worker %s started: queues=%s concurrency=%d batch_size=%d lease=%gs",
            worker.id,
            ",".join(worker.queues) if worker.queues else "*",
            worker.concurrency,
            worker.batch_size,
            worker.lease,
            extra={"action": "worker_started", "worker": worker.id},
        )

    def finished_many(self, outcomes: Sequence[Outcome], status: str) -> None:
        if not logger.isEnabledFor(DEBUG):  # only what `finished` would log
            outcomes = [o for o in outcomes if o.kind is not DONE or o.unstored is not None]
        for outcome in outcomes:
            self.finished(outcome, status)

    def finished(self, outcome: Outcome, status: str) -> None:
        kind, job = outcome.kind, outcome.job
        if kind is Kind.DONE and outcome.unstored is None and not logger.isEnabledFor(DEBUG):
            return  # the path of nearly every job: nothing to log
        extra = {
            "job_id": job.id,
            "task": job.task_name,
            "attempt": job.attempt,
            "duration": round(outcome.duration, 6),
        }
        if kind is Kind.DONE:
            if outcome.unstored is not None:
                logger.warning(
                    "job %d (%s) is done, but its result is not stored: %s",
                    job.id,
                    job.task_name,
                    outcome.unstored,
                    extra={"action": "result_not_stored", **extra},
                )
            elif logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "job %d (%s) done in %.3fs",
                    job.id,
                    job.task_name,
                    outcome.duration,
                    extra={"action": "job_done", **extra},
                )
            return
        if kind is Kind.RETRY and status == "queued":
            logger.warning(
                "job %d (%s) attempt %d of %d failed, retrying in %.1fs: %s",
                job.id,
                job.task_name,
                job.attempt,
                job.max_attempts,
                outcome.delay,
                _first_line(outcome.error),
                extra={"action": "job_retry", **extra},
            )
        elif status == "failed":
            logger.error(
                "job %d (%s) failed for good after attempt %d of %d: %s",
                job.id,
                job.task_name,
                job.attempt,
                job.max_attempts,
                _first_line(outcome.error),
                extra={"action": "job_failed", **extra},
            )
        elif status == "cancelled":
            logger.info(
                "job %d (%s) cancelled during attempt %d",
                job.id,
                job.task_name,
                job.attempt,
                extra={"action": "job_cancelled", **extra},
            )
        elif kind is Kind.SNOOZE:
            logger.info(
                "job %d (%s) snoozed for %.1fs",
                job.id,
                job.task_name,
                outcome.delay,
                extra={"action": "job_snoozed", **extra},
            )
        elif kind is Kind.GIVE_BACK:
            logger.warning(
                "job %d (%s) given back: unknown task %r on this worker, left for a worker"
                " that knows it (the attempt does not count); this worker claims no more"
                " of its jobs",
                job.id,
                job.task_name,
                job.task_name,
                extra={"action": "job_given_back", **extra},
            )
        elif kind is Kind.SUSPEND:
            logger.debug(
                "job %d (%s) is waiting (attempt %d)",
                job.id,
                job.task_name,
                job.attempt,
                extra={"action": "job_waiting", **extra},
            )
        elif kind is Kind.RELEASE:
            logger.info(
                "job %d (%s) handed back to the queue (attempt %d)",
                job.id,
                job.task_name,
                job.attempt,
                extra={"action": "job_released", **extra},
            )

    def lease_lost(self, job: Job, why: str) -> None:
        logger.warning(
            "job %d: lease lost during attempt %d (%s)",
            job.id,
            job.attempt,
            why,
            extra={"action": "lease_lost", "job_id": job.id},
        )

    def fenced(self, job: Job, unrenewed: float) -> None:
        logger.warning(
            "job %d (%s): lease not renewed for %.1fs: stopping attempt %d before another"
            " worker may take the job",
            job.id,
            job.task_name,
            unrenewed,
            job.attempt,
            extra={"action": "lease_fenced", "job_id": job.id},
        )

    def aborting(self, job: Job) -> None:
        logger.info(
            "job %d (%s): stopping attempt %d, a cancel asked for it",
            job.id,
            job.task_name,
            job.attempt,
            extra={"action": "job_aborting", "job_id": job.id},
        )

    def unrecorded(self, outcome: Outcome, error: BaseException) -> None:
        job = outcome.job
        logger.error(
            "job %d (%s): the database refused the outcome of attempt %d (%s: %s);"
            " its lease will bring it back",
            job.id,
            job.task_name,
            job.attempt,
            type(error).__name__,
            _first_line(str(error)),
            extra={"action": "outcome_refused", "job_id": job.id},
        )

    def rescued(self, jobs: Mapping[int, str]) -> None:
        for job_id, status in jobs.items():
            logger.warning(
                "job %d: its worker stopped renewing the lease; now %s",
                job_id,
                status,
                extra={"action": "job_reaped", "job_id": job_id},
            )

    def fired(self, schedule: str, slot: datetime, job_id: int) -> None:
        logger.info(
            "schedule %s: slot %s made job %d",
            schedule,
            slot.isoformat(),
            job_id,
            extra={"action": "schedule_fired", "schedule": schedule, "job_id": job_id},
        )

    def stopping(self, running: int, grace: float) -> None:
        logger.info(
            "stopping: no new claims; waiting up to %gs for %d running jobs",
            grace,
            running,
            extra={"action": "worker_stopping"},
        )

    def stopped_running(self, jobs: Sequence[Job]) -> None:
        logger.warning(
            "grace period over: cancelling %d running jobs and handing them back",
            len(jobs),
            extra={"action": "jobs_cancelled"},
        )

    def left_running(self, jobs: Sequence[Job]) -> None:
        logger.error(
            "%d jobs did not stop when cancelled (%s); leaving them to their lease",
            len(jobs),
            ", ".join(f"job {j.id} ({j.task_name})" for j in jobs[:10]),
            extra={"action": "jobs_left_running"},
        )

    def stopped(self, stats: WorkerStats) -> None:
        logger.info(
            "worker %s stopped: %d claimed, %d done, %d failed attempts, %d handed back",
            stats.worker,
            stats.claimed,
            stats.done,
            stats.failed_attempts,
            stats.released,
            extra={"action": "worker_stopped", "worker": stats.worker},
        )

    def service_failed(self, service: str, error: BaseException, retry_in: float) -> None:
        text = _first_line(str(error).strip())
        logger.warning(
            "%s (%s%s); trying again in %.1fs",
            _FAILED.get(service, f"{service} failed"),
            type(error).__name__,
            f": {text}" if text else "",
            retry_in,
            extra={"action": f"{service}_failed"},
        )

    def listener_connected(self, reconnected: bool) -> None:
        if reconnected:
            logger.info("listener reconnected", extra={"action": "listener_reconnected"})

    def limits_changed(self, in_force: Mapping[str, Sourced], *, at_start: bool = False) -> None:
        if at_start and all(
            source in (None, "code")
            for s in in_force.values()
            for source in (s.concurrency, s.rate, s.group_concurrency)
        ):
            return  # the code's, as declared: nothing to say
        logger.info(
            "limits in force: %s",
            "; ".join(f"{name} {describe(s)}" for name, s in sorted(in_force.items())) or "none",
            extra={"action": "limits_changed"},
        )
