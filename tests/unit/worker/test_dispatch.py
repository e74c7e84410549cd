"""The dispatcher: runners, held attempts, and the worker's own stops of an attempt (lease
lost, timeout, shutdown), which reach exactly the attempt they are meant for."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

import asyncq
from asyncq.job import Job
from asyncq.worker import dispatch
from asyncq.worker.dispatch import Dispatcher
from asyncq.worker.executor import Executor
from asyncq.worker.observer import AttemptEnded, Observer
from asyncq.worker.outcomes import Kind, Outcome, Stop, decide
from asyncq.worker.settings import FENCE_AFTER
from asyncq.worker.slots import Slots
from asyncq.worker.threads import Threads
from tests.harness.waiting import until


class FakeTask:
    def __init__(self, name: str, fn: Callable[..., Awaitable[Any]], timeout: float | None = None):
        self.name = name
        self.fn = fn
        self.retry = asyncq.Backoff(base=1, factor=1, cap=1, jitter=0)
        self.retry_on: tuple[type[BaseException], ...] | None = None
        self.timeout = timeout
        self.blocking = False

    def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]:
        return self.fn(**stored_args)  # type: ignore[return-value]


class Lost(Observer):
    def __init__(self) -> None:
        self.lost: list[tuple[int, str]] = []
        self.left: list[int] = []
        self.fenced_after: dict[int, float] = {}

    def lease_lost(self, job: Job, why: str) -> None:
        self.lost.append((job.id, why))

    def fenced(self, job: Job, unrenewed: float) -> None:
        self.fenced_after[job.id] = unrenewed

    def left_running(self, jobs: Any) -> None:
        self.left += [j.id for j in jobs]


class Harness:
    def __init__(self, concurrency: int, *tasks: FakeTask, lease: float = 30.0) -> None:
        self.tasks = {t.name: t for t in tasks}
        self.outcomes: dict[int, Outcome] = {}
        self.observer = Lost()
        self.slots = Slots(concurrency)
        self.dispatcher = Dispatcher(
            concurrency=concurrency,
            tasks=self.tasks,
            executor=Executor(tasks=self.tasks, worker="w", threads=Threads(1)),
            slots=self.slots,
            submit=self.submitted,
            observer=self.observer,
            lease=lease,
        )
        self.ended = asyncio.Event()
        self.next_id = 0

    def submitted(self, outcome: Outcome) -> None:
        self.outcomes[outcome.job.id] = outcome
        self.ended.set()

    def hold(self, task: str, sent: float | None = None, **args: Any) -> int:
        self.next_id += 1
        self.slots.take(1)
        self.dispatcher.hold(Job(self.next_id, task, "q", json.dumps(args), 1, 3, 1), sent)
        return self.next_id

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(30):
            while not predicate():
                self.ended.clear()
                await self.ended.wait()


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(main())


def test_an_attempt_that_returns_nothing_ends_in_the_outcome_decide_makes() -> None:
    # The runner makes this outcome itself, field by field, for speed: it must be the one
    # outcomes.decide makes, or the completer would write another kind, or lose a field.
    async def main() -> None:
        async def nothing() -> None:
            return None

        h = Harness(1, FakeTask("n", nothing))
        h.dispatcher.start()
        job_id = h.hold("n")
        await h.until(lambda: job_id in h.outcomes)
        outcome = h.outcomes[job_id]
        job = h.dispatcher.held[job_id].job
        assert outcome == decide(job, h.tasks["n"], duration=outcome.duration)
        assert outcome.kind is Kind.DONE and outcome.result is None and outcome.duration > 0

    run(main)


def test_a_stop_sent_as_an_attempt_ends_reaches_that_attempt_not_the_next() -> None:
    # One runner. A's last await resolves and, in the same turn of the loop, before the
    # runner resumes, A's lease is found lost: the stop must land in A (its outcome is
    # dropped), never in B, the next job the runner takes.
    async def main() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        b_ran: list[str] = []

        async def a() -> None:
            await gate

        async def b() -> None:
            await asyncio.sleep(0.01)
            b_ran.append("b")

        h = Harness(1, FakeTask("a", a), FakeTask("b", b))
        h.dispatcher.start()
        a_id = h.hold("a")
        b_id = h.hold("b")
        await asyncio.sleep(0.01)  # A runs, waiting on the gate
        attempt_a = h.dispatcher.held[a_id]
        gate.set_result(None)
        h.dispatcher.lose(attempt_a, "reaped")
        await h.until(lambda: b_id in h.outcomes)
        assert h.outcomes[b_id].kind is Kind.DONE and b_ran == ["b"]
        assert a_id not in h.outcomes  # lost: nothing to write
        assert h.observer.lost == [(a_id, "reaped")]
        assert not h.dispatcher.held.get(a_id)

    run(main)


def test_a_cancelled_error_the_task_raises_fails_its_attempt_and_nothing_else() -> None:
    async def main() -> None:
        async def itself() -> None:
            raise asyncio.CancelledError()

        async def slow() -> str:
            await asyncio.sleep(0.05)
            return "slow"

        h = Harness(2, FakeTask("itself", itself), FakeTask("slow", slow))
        h.dispatcher.start()
        slow_id = h.hold("slow")
        itself_id = h.hold("itself")
        again = h.hold("slow")  # on the runner that ran `itself`
        await h.until(lambda: len(h.outcomes) == 3)
        assert h.outcomes[itself_id].kind is Kind.RETRY
        assert "CancelledError" in (h.outcomes[itself_id].error or "")
        assert h.outcomes[slow_id].kind is h.outcomes[again].kind is Kind.DONE
        assert h.outcomes[again].result == '"slow"'  # stored as JSON text

    run(main)


def test_a_timeout_cancels_only_its_attempt_and_the_runner_goes_on() -> None:
    async def main() -> None:
        async def sleepy() -> None:
            await asyncio.sleep(10)

        async def quick() -> int:
            async with asyncio.timeout(1):  # a timeout of the task's own still works after
                await asyncio.sleep(0.01)
            return 1

        h = Harness(1, FakeTask("sleepy", sleepy, timeout=0.05), FakeTask("quick", quick))
        h.dispatcher.start()
        sleepy_id = h.hold("sleepy")
        quick_id = h.hold("quick")
        await h.until(lambda: len(h.outcomes) == 2)
        assert h.outcomes[sleepy_id].kind is Kind.RETRY
        assert (h.outcomes[sleepy_id].error or "").startswith("TimeoutError: attempt 1 of 3")
        assert h.outcomes[quick_id].kind is Kind.DONE

    run(main)


def test_a_task_that_swallows_a_stop_and_returns_is_done_and_leaves_no_cancel_behind() -> None:
    async def main() -> None:
        async def swallows() -> str:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            return "swallowed"

        async def after() -> str:
            await asyncio.sleep(0.01)
            current = asyncio.current_task()
            assert current is not None
            return f"cancelling={current.cancelling()}"

        h = Harness(1, FakeTask("swallows", swallows, timeout=0.02), FakeTask("after", after))
        h.dispatcher.start()
        first = h.hold("swallows")
        second = h.hold("after")
        await h.until(lambda: len(h.outcomes) == 2)
        assert h.outcomes[first].kind is Kind.DONE
        assert h.outcomes[second].result == '"cancelling=0"'

    run(main)


def test_shutdown_hands_back_what_outlives_the_grace_and_leaves_the_stubborn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "STOP_DEADLINE", 0.2)

    async def main() -> None:
        finish = asyncio.Event()
        ended: list[str] = []

        async def sleeps() -> None:
            await asyncio.sleep(10)

        async def stubborn() -> None:
            while not finish.is_set():  # deaf to every stop, until the test lets it end
                with contextlib.suppress(asyncio.CancelledError):
                    await finish.wait()
            ended.append("stubborn")

        h = Harness(3, FakeTask("sleeps", sleeps), FakeTask("stubborn", stubborn))
        h.dispatcher.start()
        sleeping = h.hold("sleeps")
        stubborn_id = h.hold("stubborn")
        await asyncio.sleep(0.02)  # both run: a few turns of the loop
        async with asyncio.timeout(30):  # the stubborn one never ends by itself
            left = await h.dispatcher.stop(grace=0.05)
        assert ended == []
        assert [j.id for j in left] == [stubborn_id] and h.observer.left == [stubborn_id]
        assert h.outcomes[sleeping].kind is Kind.RELEASE
        assert stubborn_id not in h.outcomes and stubborn_id not in h.dispatcher.held
        finish.set()  # it ends on its own later: nothing is written for it
        await until(lambda: ended, what="the stubborn attempt to end")
        await asyncio.sleep(0.05)  # the turns in which its outcome would be handed in
        assert stubborn_id not in h.outcomes

    run(main)


def test_a_job_claimed_again_here_loses_the_earlier_claim() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        gates: dict[int, asyncio.Future[None]] = {1: loop.create_future(), 2: loop.create_future()}

        async def waits() -> None:
            await gates[asyncq.current_job().attempt]

        h = Harness(2, FakeTask("waits", waits))
        h.dispatcher.start()
        first = Job(7, "waits", "q", "{}", 1, 3, 1)
        h.slots.take(1)
        h.dispatcher.hold(first)
        await asyncio.sleep(0.01)
        h.slots.take(1)
        h.dispatcher.hold(first._replace(attempt=2, claim=2))
        gates[2].set_result(None)
        await h.until(lambda: 7 in h.outcomes)
        assert h.outcomes[7].job.claim == 2
        assert h.observer.lost == [(7, "claimed again here as attempt 2")]

    run(main)


class Around(Lost):
    """Sets a context variable while each attempt runs, as a tracing observer would."""

    def __init__(self, var: contextvars.ContextVar[str]) -> None:
        super().__init__()
        self.var = var
        self.ends: list[tuple[int, Kind | None, str | None, Stop | None]] = []

    def running(self, job: Job) -> AttemptEnded | None:
        token = self.var.set(f"attempt of job {job.id}")

        def ended(outcome: Outcome | None, error: BaseException | None, stop: Stop | None) -> None:
            self.var.reset(token)
            kind = None if outcome is None else outcome.kind
            self.ends.append((job.id, kind, None if error is None else type(error).__name__, stop))

        return ended


def test_the_hook_around_an_attempt_is_in_the_task_s_context_and_hears_how_it_ended() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("around", default="none")

    async def main() -> None:
        async def sees() -> str:
            return var.get()

        async def fails() -> None:
            raise ValueError("no")

        async def sleepy() -> None:
            await asyncio.sleep(10)

        h = Harness(1, FakeTask("sees", sees), FakeTask("fails", fails))
        h.tasks["sleepy"] = FakeTask("sleepy", sleepy, timeout=0.02)
        around = Around(var)
        h.observer = around
        h.dispatcher = Dispatcher(
            concurrency=1,
            tasks=h.tasks,
            executor=Executor(tasks=h.tasks, worker="w", threads=Threads(1)),
            slots=h.slots,
            submit=h.submitted,
            observer=around,
            lease=30.0,
        )
        h.dispatcher.start()
        seen = h.hold("sees")
        failed = h.hold("fails")
        timed_out = h.hold("sleepy")
        again = h.hold("sees")  # on the same runner: what the hook set is gone
        await h.until(lambda: len(h.outcomes) == 4)
        assert h.outcomes[seen].result == f'"attempt of job {seen}"'
        assert h.outcomes[again].result == f'"attempt of job {again}"'
        assert around.ends == [
            (seen, Kind.DONE, None, None),
            (failed, Kind.RETRY, "ValueError", None),
            (timed_out, Kind.RETRY, "CancelledError", Stop.TIMEOUT),
            (again, Kind.DONE, None, None),
        ]
        assert var.get() == "none"

    run(main)


def test_an_observer_watches_attempts_only_when_it_defines_the_hook() -> None:
    class Quiet(Observer):
        def running(self, job: Job) -> AttemptEnded | None:
            return None

    assert not Lost().watches_attempts and Quiet().watches_attempts
    assert Harness(1).dispatcher._watched is False


# -- the self-fence ------------------------------------------------------------------------


# The lease of the self-fence's tests: its fence is 0.8 s after the claim or renewal.
LEASE = 1.0
FENCE = LEASE * FENCE_AFTER


def test_an_attempt_whose_lease_is_not_renewed_is_stopped_before_the_lease_ends() -> None:
    # Unrenewed, the attempt is stopped at the fence after its claim was sent, before the
    # lease ends, and nothing is written for it; the runner goes on with the next job.
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped: list[float] = []
        stop_seen = asyncio.Event()

        async def long() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                stopped.append(loop.time())
                stop_seen.set()
                raise

        async def quick() -> None:
            pass

        h = Harness(1, FakeTask("long", long), FakeTask("quick", quick), lease=LEASE)
        h.dispatcher.start()
        sent = loop.time()
        long_id = h.hold("long", sent)
        async with asyncio.timeout(30):
            await stop_seen.wait()
        quick_id = h.hold("quick")
        await h.until(lambda: quick_id in h.outcomes)
        assert long_id not in h.outcomes and long_id not in h.dispatcher.held
        assert FENCE <= stopped[0] - sent < LEASE, stopped[0] - sent
        assert list(h.observer.fenced_after) == [long_id]
        assert FENCE <= h.observer.fenced_after[long_id] < LEASE
        assert h.observer.lost == []  # given up by the fence, not found lost by the heartbeat
        assert h.outcomes[quick_id].kind is Kind.DONE

    run(main)


def test_each_renewal_moves_the_fence_and_a_claim_sent_long_ago_never_starts() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ran: list[str] = []

        async def renewed() -> str:
            await asyncio.sleep(2 * FENCE)  # renewed every 0.1 s, it ends
            return "renewed"

        async def late() -> None:
            ran.append("late")

        h = Harness(2, FakeTask("renewed", renewed), FakeTask("late", late), lease=LEASE)
        h.dispatcher.start()
        kept = h.hold("renewed")
        stale = h.hold("late", loop.time() - (FENCE + LEASE) / 2)  # sent past its fence
        attempt = h.dispatcher.held[kept]
        while kept not in h.outcomes:
            h.dispatcher.renewed(attempt, loop.time())
            await asyncio.sleep(0.1)
        assert h.outcomes[kept].result == '"renewed"'
        assert stale not in h.outcomes and ran == []  # stopped before it started
        assert list(h.observer.fenced_after) == [stale]

    run(main)


def test_an_ended_attempt_waiting_for_its_write_is_left_to_the_fence_on_the_write() -> None:
    async def main() -> None:
        async def quick() -> int:
            return 1

        h = Harness(1, FakeTask("quick", quick), lease=LEASE)
        h.dispatcher.start()
        done = h.hold("quick")
        await h.until(lambda: done in h.outcomes)
        await asyncio.sleep(LEASE)  # past the fence: its outcome is not written yet
        assert done in h.dispatcher.held and not h.observer.fenced_after

    run(main)
