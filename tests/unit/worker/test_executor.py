"""One attempt: the task looked up, its arguments decoded, the context set, the
middleware chain around the call."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import asyncq
from asyncq.job import Job
from asyncq.worker.executor import Executor
from asyncq.worker.threads import Threads


class Echo:
    name = "echo"
    retry = asyncq.Backoff()
    retry_on = None
    timeout = None
    blocking = False

    def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]:
        async def run() -> Any:
            return (asyncq.current_job().id, stored_args)

        return run()


def job(args: str = '{"x": 1}') -> Job:
    return Job(5, "echo", "q", args, 1, 3, 1)


def test_the_task_gets_its_decoded_arguments_in_its_job_context() -> None:
    executor = Executor(tasks={"echo": Echo()}, worker="w", threads=Threads(1))
    assert asyncio.run(executor.run(job(), Echo())) == (5, {"x": 1})
    with pytest.raises(asyncq.NotInJob):
        asyncq.current_job()


def test_an_unknown_task_and_undecodable_arguments_are_the_attempts_errors() -> None:
    executor = Executor(tasks={}, worker="w", threads=Threads(1))
    with pytest.raises(asyncq.TaskNotFound, match="'echo'"):
        asyncio.run(executor.run(job(), None))
    with pytest.raises(asyncq.UndecodableArguments, match="digits"):
        asyncio.run(executor.run(job('{"x": ' + "9" * 5000 + "}"), Echo()))


def test_middleware_wraps_the_call_in_order_and_may_change_its_result() -> None:
    seen: list[str] = []

    async def outer(context: asyncq.JobContext, call_next: Any) -> Any:
        seen.append(f"outer {context.id}")
        return ("outer", await call_next())

    async def inner(context: asyncq.JobContext, call_next: Any) -> Any:
        seen.append(f"inner {asyncq.current_job().id}")
        return await call_next()

    executor = Executor(
        tasks={"echo": Echo()}, worker="w", threads=Threads(1), middleware=[outer, inner]
    )
    assert asyncio.run(executor.run(job(), Echo())) == ("outer", (5, {"x": 1}))
    assert seen == ["outer 5", "inner 5"]


def test_the_job_context_is_the_attempts_whole_and_one_object_through_the_attempt() -> None:
    slot = datetime(2026, 1, 2, 3, 4, tzinfo=timezone(timedelta(hours=2)))
    seen: list[asyncq.JobContext] = []

    class Looks(Echo):
        def call_stored(self, stored_args: Any) -> Coroutine[Any, Any, Any]:
            async def run() -> None:
                seen.extend([asyncq.current_job(), asyncq.current_job()])

            return run()

    async def middleware(context: asyncq.JobContext, call_next: Any) -> Any:
        seen.append(context)
        return await call_next()

    scheduled = Job(7, "echo", "mail", "{}", 2, 4, 3, slot)
    for chain in ([], [middleware]):
        seen.clear()
        executor = Executor(tasks={}, worker="w-1", threads=Threads(1), middleware=chain)
        asyncio.run(executor.run(scheduled, Looks()))
        assert seen[0] == asyncq.JobContext(
            id=7,
            task_name="echo",
            queue="mail",
            attempt=2,
            max_attempts=4,
            worker="w-1",
            scheduled_at=slot.astimezone(UTC),
        )
        assert seen[0].scheduled_at is not None and seen[0].scheduled_at.tzinfo is UTC
        assert all(context is seen[0] for context in seen), seen
