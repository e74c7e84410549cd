"""What an attempt's end means for its job: `decide`, as a table."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import pytest

import asyncq
from asyncq.codec import MAX_RESULT_BYTES
from asyncq.job import Job
from asyncq.worker.outcomes import UNKNOWN_TASK_DELAY, Kind, Stop, decide

FIXED = asyncq.Backoff(base=7, factor=1, cap=7, jitter=0)


@dataclass(frozen=True)
class Policy:
    retry: asyncq.Backoff = FIXED
    retry_on: tuple[type[BaseException], ...] | None = None
    timeout: float | None = None


def job(attempt: int = 1, max_attempts: int = 3) -> Job:
    return Job(1, "t", "q", "{}", attempt, max_attempts, 1)


CASES: list[tuple[str, dict[str, Any], Kind | None, float, str | None]] = [
    # (what happened, decide's arguments, kind, delay, last_error starts with)
    ("returned", {"result": 42}, Kind.DONE, 0.0, None),
    ("raised, attempts left", {"error": ValueError("x")}, Kind.RETRY, 7.0, "ValueError: x"),
    (
        "raised on its last attempt",
        {"job": job(3, 3), "error": ValueError("x")},
        Kind.FAIL,
        0.0,
        "ValueError: x",
    ),
    (
        "raised CancelledError itself",
        {"error": asyncio.CancelledError()},
        Kind.RETRY,
        7.0,
        "asyncio.exceptions.CancelledError",
    ),
    ("raised SystemExit", {"error": SystemExit(3)}, Kind.RETRY, 7.0, "SystemExit: 3"),
    ("Retry()", {"error": asyncq.Retry()}, Kind.RETRY, 7.0, "Retry: retry requested by the task"),
    (
        "Retry(after=2)",
        {"error": asyncq.Retry(after=2, reason="later")},
        Kind.RETRY,
        2.0,
        "Retry: later",
    ),
    ("Retry on the last attempt", {"job": job(3, 3), "error": asyncq.Retry(1)}, Kind.FAIL, 0, ""),
    ("Snooze(5)", {"error": asyncq.Snooze(5)}, Kind.SNOOZE, 5.0, None),
    (
        "Snooze on the last attempt",
        {"job": job(3, 3), "error": asyncq.Snooze(5)},
        Kind.SNOOZE,
        5,
        None,
    ),
    ("Discard", {"error": asyncq.Discard("bad order")}, Kind.FAIL, 0.0, "Discard: bad order"),
    (
        "an error retry_on does not name",
        {"policy": Policy(retry_on=(KeyError,)), "error": ValueError("x")},
        Kind.FAIL,
        0.0,
        "ValueError: x",
    ),
    (
        "an error retry_on names",
        {"policy": Policy(retry_on=(KeyError,)), "error": KeyError("k")},
        Kind.RETRY,
        7.0,
        "KeyError",
    ),
    (
        "arguments that cannot be decoded",
        {"error": asyncq.UndecodableArguments("the stored arguments cannot be decoded")},
        Kind.FAIL,
        0.0,
        "asyncq.errors.UndecodableArguments",
    ),
    (
        "an unknown task: given back, for a worker that knows it",
        {"policy": None, "error": asyncq.TaskNotFound("unknown task")},
        Kind.GIVE_BACK,
        UNKNOWN_TASK_DELAY,
        "asyncq.errors.TaskNotFound",
    ),
    ("its lease lost", {"error": ValueError(), "stop": Stop.LEASE_LOST}, None, 0.0, None),
    ("its lease lost, returned", {"result": 1, "stop": Stop.LEASE_LOST}, None, 0.0, None),
    (
        "stopped by a shutdown",
        {"error": asyncio.CancelledError(), "stop": Stop.SHUTDOWN},
        Kind.RELEASE,
        0.0,
        None,
    ),
    ("stopped by a shutdown, returned", {"result": 1, "stop": Stop.SHUTDOWN}, Kind.DONE, 0, None),
    (
        "timed out",
        {"policy": Policy(timeout=2.5), "error": asyncio.CancelledError(), "stop": Stop.TIMEOUT},
        Kind.RETRY,
        7.0,
        "TimeoutError: attempt 1 of 3 timed out after 2.5s",
    ),
    (
        "timed out on its last attempt",
        {
            "job": job(3, 3),
            "policy": Policy(timeout=1),
            "error": asyncio.CancelledError(),
            "stop": Stop.TIMEOUT,
        },
        Kind.FAIL,
        0.0,
        "TimeoutError: attempt 3 of 3 timed out",
    ),
]


@pytest.mark.parametrize(
    ("what", "given", "kind", "delay", "error"), CASES, ids=[c[0] for c in CASES]
)
def test_decide(
    what: str, given: dict[str, Any], kind: Kind | None, delay: float | None, error: str | None
) -> None:
    arguments = {"policy": Policy(), **given}
    the_job = arguments.pop("job", job())
    outcome = decide(the_job, arguments.pop("policy"), **arguments)
    if kind is None:
        assert outcome is None
        return
    assert outcome is not None and outcome.job is the_job
    assert outcome.kind is kind
    if delay is not None:
        assert outcome.delay == delay
    else:  # the default backoff: at least a second
        assert outcome.delay >= 1.0
    if error is None:
        assert outcome.error is None
    else:
        assert outcome.error is not None and outcome.error.startswith(error), outcome.error
    if kind is Kind.DONE:
        assert outcome.result == json.dumps(given.get("result"))
        assert outcome.unstored is None


@pytest.mark.parametrize(
    ("returned", "stored"),
    [
        (None, None),
        ({"total": 3, "items": ["a", "ü"]}, '{"total":3,"items":["a","ü"]}'),
        ([1, 2.5, True, None], "[1,2.5,true,null]"),
        ("text", '"text"'),
        ((1, 2), "[1,2]"),
    ],
)
def test_a_returned_value_is_stored_as_json_text(returned: Any, stored: str | None) -> None:
    outcome = decide(job(), Policy(), result=returned)
    assert outcome is not None and outcome.kind is Kind.DONE
    assert (outcome.result, outcome.unstored) == (stored, None)


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        ({1, 2}, "the result of t must be JSON-serialisable: Object of type set"),
        (float("nan"), "the result of t must be JSON-serialisable: Out of range float"),
        ({"x": float("inf")}, "must be JSON-serialisable: Out of range float"),
        ("nul \x00 inside", "the result of t contains a NUL character"),
        ("lone \ud800", "the result of t contain a lone surrogate"),
        ("x" * (MAX_RESULT_BYTES + 1), "the result of t is 1048579 bytes as JSON; the cap"),
    ],
)
def test_a_result_that_cannot_be_stored_leaves_the_job_done_without_it(
    returned: Any, why: str
) -> None:
    outcome = decide(job(), Policy(), result=returned)
    assert outcome is not None and outcome.kind is Kind.DONE
    assert outcome.result is None
    assert outcome.unstored is not None and why in outcome.unstored, outcome.unstored


def test_a_result_whose_own_code_raises_is_not_stored() -> None:
    class Odd(dict[str, Any]):
        def items(self) -> Any:
            raise LookupError("odd")

    outcome = decide(job(), Policy(), result=Odd(a=1))
    assert outcome is not None and outcome.kind is Kind.DONE and outcome.result is None


def test_control_exceptions_validate_their_delays() -> None:
    for bad in (-1, float("inf"), float("nan"), 1e12, "5"):
        with pytest.raises(ValueError):
            asyncq.Retry(after=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            asyncq.Snooze(bad)  # type: ignore[arg-type]
