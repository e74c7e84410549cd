"""The completer: writes outcomes in batches, one statement per kind, fenced per claim.

Outcomes that arrive while a write is in flight are written together by the next
one, so batches grow with load and a lone job is written at once. A job stays held
(and its lease renewed) until its outcome is written.

A transient database error is retried with backoff. An error that would come back on
every try (the database refuses a value) costs only the job at fault: the batch is
written again one outcome at a time, and an outcome refused on its own is replaced by
a failure that says it could not be recorded, or, if even that is refused, left to
the job's lease. A done job whose result is refused is written done without it.

A write may commit and lose its answer with its connection: its retry is refused by the
fence. An outcome refused so is looked up before it is reported as a lease lost. So a
write may be cut early, at the pace of the writes before it (`asyncq.pools.Pace`): one
stuck on a dead connection is tried again on another within seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskStatus
from psycopg_pool import AsyncConnectionPool

from asyncq.job import Job
from asyncq.pools import DEADLINE, KeptConnection, Pace
from asyncq.store import Conn, Store
from asyncq.transient import is_transient
from asyncq.worker.observer import Observer
from asyncq.worker.outcomes import DONE, Kind, Outcome
from asyncq.worker.services import retrying
from asyncq.worker.settings import FREE_HANDBACKS

MAX_BATCH = 1000
# What `_find_written` looks for, by the kind of outcome (see written_by_claims).
_WRITTEN_MARKS = {
    Kind.DONE: "done",
    Kind.RETRY: "failed",
    Kind.FAIL: "failed",
    Kind.SNOOZE: "snoozed",
    Kind.CANCEL: "cancelled",
    Kind.RELEASE: "released",
    Kind.GIVE_BACK: "snoozed",  # queued again, the attempt not counted, as a snooze
}


class Completer:
    name = "completer"

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool,
        store: Store,
        worker: str,
        observer: Observer,
        on_written: Callable[[Sequence[Job]], None],
        storable: Callable[[str], str],
    ) -> None:
        self.kept = KeptConnection(pool, deadline=Pace(DEADLINE))
        self.store = store
        self.worker = worker
        self.observer = observer
        self.on_written = on_written
        self.storable = storable  # error text made storable in the database's encoding
        self._pending: list[Outcome] = []
        self._plain: list[Outcome] = []  # done, with nothing to store: a claim may write them
        self._arrived = asyncio.Event()
        self._closed = False
        self._writing = 0  # writes under way
        self._write_ended = asyncio.Event()
        # True while a claim is about to go out that can write the plain done outcomes
        # (`take_plain`): they wait for it rather than take a statement of their own.
        self.claim_coming: Callable[[], bool] = lambda: False

    def submit(self, outcome: Outcome) -> None:
        if outcome.kind is Kind.SUSPEND:  # written by the task itself, as it suspended
            self.observer.finished_many([outcome], "waiting")
            self.on_written([outcome.job])
            return
        if (
            outcome.kind is DONE
            and outcome.result is None
            and outcome.logs is None
            and outcome.progress is None
        ):
            self._plain.append(outcome)
        else:
            self._pending.append(outcome)
        self._arrived.set()

    def kick(self) -> None:
        """No claim is coming after all: write what waited for one."""
        if self._plain:
            self._arrived.set()

    def take_plain(self) -> list[Outcome]:
        """The plain done outcomes waiting (at most `MAX_BATCH`), for a claim to write;
        the claim's caller reports them with `written_by_claim` or `give_back`."""
        batch = self._plain[:MAX_BATCH]
        del self._plain[:MAX_BATCH]
        return batch

    def written_by_claim(self, batch: Sequence[Outcome], written: int) -> None:
        """A claim wrote ``written`` of ``batch`` (from `take_plain`) done."""
        if written == len(batch):
            self.observer.finished_many(batch, "done")
            self.on_written([outcome.job for outcome in batch])
        else:
            # Some were refused (leases lost, or written already by an earlier try whose
            # answer was lost): the fenced write here refuses them again, and looks up why.
            self.give_back(batch)

    def give_back(self, batch: Sequence[Outcome]) -> None:
        """A claim that was to write ``batch`` failed: write it here."""
        self._pending[:0] = batch
        self._arrived.set()

    async def finish(self) -> None:
        """Write everything submitted, in the caller's task, then let `run` end. A write
        `run` has under way ends first: cut off (`run` is cancelled next), its outcomes
        would be left to their lease, and their jobs run again. The caller bounds the
        wait, and shields it: a worker cancelled by its caller still writes its
        hand-backs, though `run` was cancelled with it."""
        self._closed = True
        self._arrived.set()
        while self._writing:
            self._write_ended.clear()
            await self._write_ended.wait()
        while self._pending or self._plain:
            await self._write_pending()
        await self.kept.release()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while not self._closed:
                if self._pending or (self._plain and not self.claim_coming()):
                    await self._write_pending()
                else:
                    self._arrived.clear()
                    await self._arrived.wait()
        finally:
            await self.kept.release()

    async def _write_pending(self) -> None:
        batch = self._pending[:MAX_BATCH]
        del self._pending[:MAX_BATCH]
        room = MAX_BATCH - len(batch)
        if room > 0 and self._plain:
            batch += self._plain[:room]
            del self._plain[:room]
        self._writing += 1
        try:
            await retrying(self.name, partial(self._write, batch), self.observer)
        except BaseException:
            # Cancelled: what is left of the batch waits for `finish`. Written already or
            # not, writing it again is safe: the fence refuses a second write.
            self._pending[:0] = batch
            raise
        finally:
            self._writing -= 1
            self._write_ended.set()

    async def _write(self, batch: list[Outcome]) -> None:
        try:
            statuses = await self._write_batch(batch)
        except Exception as exc:
            if is_transient(exc):
                raise
            await self._write_each(batch, exc)
            return
        if len(statuses) < len(batch):
            await self._find_written(batch, statuses)
        self._written(batch, statuses)

    async def _find_written(self, batch: Sequence[Outcome], statuses: dict[int, str]) -> None:
        """Add to ``statuses`` the outcomes the fence refused because an earlier try of
        this batch wrote them: it committed, and its answer was lost with the connection.
        Any other refused outcome is a lease lost."""
        refused = [o for o in batch if o.job.id not in statuses]
        if refused:
            async with self.kept.connection() as conn:
                written = await self.store.written_by_claims(
                    conn,
                    worker=self.worker,
                    jobs=[o.job for o in refused],
                    kinds=[_WRITTEN_MARKS[o.kind] for o in refused],
                    errors=[self.storable(o.error or "") for o in refused],
                )
            statuses.update(written)

    async def _write_batch(self, batch: Sequence[Outcome]) -> dict[int, str]:
        by_kind: dict[Kind, list[Outcome]] = {}
        for outcome in batch:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        async with self.kept.connection() as conn:
            if len(by_kind) == 1:
                [(kind, outcomes)] = by_kind.items()
                return await self._statement(conn, kind, outcomes)
            # One transaction, so that a retry never repeats half a write.
            statuses: dict[int, str] = {}
            async with conn.transaction():
                await self.store.limit_idle(conn)
                for kind, outcomes in by_kind.items():
                    statuses.update(await self._statement(conn, kind, outcomes))
            return statuses

    async def _statement(self, conn: Conn, kind: Kind, outcomes: list[Outcome]) -> dict[int, str]:
        """Write outcomes of one kind; the new status of each job this worker still owned."""
        jobs = [o.job for o in outcomes]
        store, worker = self.store, self.worker
        # What the attempts logged, and the progress they reported last: the plain path's
        # outcomes have neither.
        logs = progress = None
        if any(o.logs is not None or o.progress is not None for o in outcomes):
            logs = [o.logs for o in outcomes]
            progress = [o.progress for o in outcomes]
        if kind is Kind.DONE:
            results = [o.result for o in outcomes]
            done = await store.mark_done(
                conn, worker=worker, jobs=jobs, results=results, logs=logs, progress=progress
            )
            return dict.fromkeys(done, "done")
        if kind is Kind.SNOOZE:
            after = [o.delay for o in outcomes]
            return await store.mark_snoozed(
                conn, worker=worker, jobs=jobs, after=after, logs=logs, progress=progress
            )
        if kind is Kind.CANCEL:
            return await store.mark_cancelled(
                conn, worker=worker, jobs=jobs, logs=logs, progress=progress
            )
        if kind is Kind.GIVE_BACK:
            return await store.give_back(
                conn,
                worker=worker,
                jobs=jobs,
                errors=[self.storable(o.error or "") for o in outcomes],
                delay=outcomes[0].delay,
                logs=logs,
                progress=progress,
            )
        if kind is Kind.RELEASE:
            return await store.release(
                conn,
                worker=worker,
                jobs=jobs,
                free_handbacks=FREE_HANDBACKS,
                logs=logs,
                progress=progress,
            )
        return await store.mark_failed(
            conn,
            worker=worker,
            jobs=jobs,
            retry_in=[o.delay for o in outcomes],
            errors=[self.storable(o.error or "") for o in outcomes],
            give_up=[o.kind is Kind.FAIL for o in outcomes],
            logs=logs,
            progress=progress,
        )

    def _written(self, batch: Sequence[Outcome], statuses: dict[int, str]) -> None:
        observer = self.observer
        by_status: dict[str, list[Outcome]] = {}
        for outcome in batch:
            status = statuses.get(outcome.job.id)
            if status is None:
                why = f"before its outcome ({outcome.kind.value}) was written"
                observer.lease_lost(outcome.job, why)
            else:
                by_status.setdefault(status, []).append(outcome)
        for status, outcomes in by_status.items():
            observer.finished_many(outcomes, status)
        self.on_written([outcome.job for outcome in batch])

    async def _write_each(self, batch: list[Outcome], error: Exception) -> None:
        """The database refused the batch for good: find the outcome at fault. What is
        written leaves ``batch``, so that a retry after a transient error repeats nothing."""
        if len(batch) == 1:
            await self._refused(batch[0], error)
            batch.clear()
            return
        for outcome in list(batch):
            try:
                statuses = await self._write_batch([outcome])
            except Exception as exc:
                if is_transient(exc):
                    raise
                await self._refused(outcome, exc)
            else:
                self._written([outcome], statuses)
            batch.remove(outcome)

    async def _refused(self, outcome: Outcome, error: Exception) -> None:
        job = outcome.job
        if outcome.kind is Kind.DONE and (
            outcome.result is not None or outcome.logs is not None or outcome.progress is not None
        ):
            # The database refused the result (a character the server's encoding lacks,
            # say), or what the task logged: the job is done all the same, without them.
            why = f"the database refused it: {type(error).__name__}: {_first_line(error)}"
            outcome = outcome._replace(result=None, logs=None, progress=None, unstored=why)
            try:
                statuses = await self._write_batch([outcome])
            except Exception as exc:
                if is_transient(exc):
                    raise
                error = exc
            else:
                self._written([outcome], statuses)
                return
        text = (
            f"OutcomeNotRecorded: the {outcome.kind.value} outcome of attempt {job.attempt}"
            f" could not be recorded: {type(error).__name__}: {_first_line(error)}"
        )
        failed = Outcome(job, Kind.FAIL, error=text)
        try:
            statuses = await self._write_batch([failed])
        except Exception as exc:
            if is_transient(exc):
                raise
            self.observer.unrecorded(outcome, exc)
            self.on_written([job])  # no longer held: the lease brings the job back
            return
        self._written([failed], statuses)


def _first_line(error: Any) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
