"""One attempt: the task looked up, its arguments decoded, the context set, the
middleware chain around the call."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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
