"""The ``django.tasks`` backend in a real Django project: enqueue in Django's transaction,
workers in processes of their own, results through Django's result API."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import pytest

from tests.django.conftest import run_worker

pytestmark = pytest.mark.usefixtures("django_db")


@pytest.fixture
def shop(django_db: Any) -> ModuleType:
    from tests.django.project.shop import tasks

    return tasks


def order() -> Any:
    from tests.django.project.shop.models import Order

    return Order.objects.create(item="book")


def jobs(db: Any) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT id, task_name, queue, priority, status, args, run_at, max_attempts"
        " FROM asyncq_jobs ORDER BY id"
    ).fetchall()


def drain(*options: str) -> str:
    """Run the project's worker until no job is ready; its log."""
    return run_worker("django", "asyncq_worker", "--drain", *options).stderr


# -- enqueue, in Django's transaction ----------------------------------------------------


def test_a_rolled_back_transaction_leaves_no_job(shop: ModuleType, django_db: Any) -> None:
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        placed = order()
        result = shop.confirm.enqueue(placed.pk)
        # Read on Django's connection, in its transaction: the job is there, READY.
        assert shop.confirm.get_result(result.id).status == "READY"
        # Not yet on any other connection.
        assert jobs(django_db) == []
        raise Undo

    assert jobs(django_db) == []
    assert django_db.execute("SELECT count(*) FROM shop_order").fetchone() == (0,)
    with pytest.raises(TaskResultDoesNotExist):
        shop.confirm.get_result(result.id)


def test_a_committed_transaction_leaves_its_job(shop: ModuleType, django_db: Any) -> None:
    from django.db import transaction

    with transaction.atomic():
        placed = order()
        result = shop.confirm.enqueue(placed.pk)
        assert jobs(django_db) == []  # not before the commit

    [row] = jobs(django_db)
    assert row[0] == int(result.id)
    assert row[1:5] == ("django.tasks", "default", 0, "queued")
    assert row[5]["task"] == "tests.django.project.shop.tasks.confirm"
    assert (row[5]["args"], row[5]["kwargs"], row[5]["backend"]) == ([placed.pk], {}, "default")
    assert row[7] == 2  # the backend's max_attempts
    assert result.status == "READY" and result.args == [placed.pk] and result.backend == "default"
    assert result.enqueued_at is not None and result.worker_ids == [] and result.errors == []


def test_enqueue_without_a_transaction_commits_at_once(shop: ModuleType, django_db: Any) -> None:
    result = shop.email.enqueue(7, template="reminder")
    [row] = jobs(django_db)
    assert row[0] == int(result.id) and row[5]["kwargs"] == {"template": "reminder"}


def test_aenqueue_from_async_code(shop: ModuleType, django_db: Any) -> None:
    result = asyncio.run(shop.email.aenqueue(8))
    [row] = jobs(django_db)
    assert row[0] == int(result.id)
    assert asyncio.run(shop.email.aget_result(result.id)).status == "READY"


def test_arguments_that_are_not_json_are_refused_and_nothing_is_written(
    shop: ModuleType, django_db: Any
) -> None:
    from django.db import transaction

    import asyncq

    with transaction.atomic():
        placed = order()
        with pytest.raises(asyncq.ArgumentsError, match=r"tasks\.email must be JSON.*datetime"):
            shop.email.enqueue(datetime.now(UTC))
        with pytest.raises(TypeError, match="JSON"):
            shop.email.enqueue(1, template={"a": object()})
        # The transaction was not broken: it goes on and commits.
        shop.email.enqueue(placed.pk)
    assert [row[5]["args"] for row in jobs(django_db)] == [[placed.pk]]


def test_priority_queue_and_run_after_map_to_the_job(shop: ModuleType, django_db: Any) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    result = shop.email.using(priority=7, run_after=later).enqueue(9)
    [row] = jobs(django_db)
    # Django's queue "emails" is asyncq's "shop-emails" (OPTIONS queue_map).
    assert row[2:4] == ("shop-emails", 7)
    assert row[6] == later
    got = shop.email.get_result(result.id)
    assert (got.task.queue_name, got.task.priority, got.task.run_after) == ("emails", 7, later)


def test_unknown_ids_do_not_exist(shop: ModuleType, django_db: Any) -> None:
    from django.tasks import default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist

    # A job of another asyncq task is no result of a Django task.
    [(other,)] = django_db.execute(
        "INSERT INTO asyncq_jobs (task_name) VALUES ('billing.charge') RETURNING id"
    ).fetchall()
    # Nor is a job of the runner's task that enqueue did not write.
    [(by_hand,)] = django_db.execute(
        "INSERT INTO asyncq_jobs (task_name, args) VALUES ('django.tasks', '{\"x\": 1}')"
        " RETURNING id"
    ).fetchall()
    for result_id in (str(other), str(by_hand), "123456", "abc", "0", str(2**63)):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


def test_a_plain_asyncq_task_defers_on_djangos_connection(django_db: Any) -> None:
    from django.db import connection, transaction

    import asyncq

    app = asyncq.App("host=unused")  # it opens nothing: the job goes on Django's connection

    @app.task(name="billing.charge")
    def charge(order_id: int) -> None: ...

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        charge.options(conn=connection).defer_sync(1)
        raise Undo
    with transaction.atomic():
        job_id = charge.options(conn=connection).defer_sync(2)
    assert [(row[0], row[1], row[5]) for row in jobs(django_db)] == [
        (job_id, "billing.charge", {"order_id": 2})
    ]

    # A database backend of another package subclasses Django's: its connections are
    # Django connections too.
    from django.db import connections

    class Wrapper(type(connections["default"])):
        pass

    other = Wrapper(connections["default"].settings_dict, alias="wrapped")
    try:
        third = charge.options(conn=other).defer_sync(3)
    finally:
        other.close()
    assert [row[0] for row in jobs(django_db)] == [job_id, third]
    with pytest.raises(TypeError, match="Django connection, which is synchronous"):
        asyncio.run(charge.options(conn=connection).defer(4))


# -- workers -----------------------------------------------------------------------------


def test_a_worker_runs_a_plain_function_in_its_threads(shop: ModuleType, django_db: Any) -> None:
    from tests.django.project.shop.models import Order

    placed = order()
    result = shop.confirm.enqueue(placed.pk)
    log = drain()
    assert "1 claimed, 1 done" in log

    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"order": placed.pk, "thread": "asyncq-task-0"}
    assert Order.objects.get(pk=placed.pk).confirmations == 1
    assert result.attempts == 1 and result.worker_ids[0].count(":") == 2
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at  # type: ignore[operator]
    assert result.last_attempted_at == result.started_at


def test_a_worker_runs_a_coroutine_function_on_its_loop(shop: ModuleType, django_db: Any) -> None:
    from tests.django.project.shop.models import Order

    placed = order()
    result = shop.pay.enqueue(placed.pk)
    assert jobs(django_db)[0][1] == "django.tasks.async"
    drain()
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"updated": 1, "thread": "MainThread"}
    assert Order.objects.get(pk=placed.pk).paid


def test_the_worker_serves_the_backends_queues(shop: ModuleType, django_db: Any) -> None:
    emailed = shop.email.enqueue(3)
    other = shop.decline_once.enqueue(3)  # backend "once", its queue "once"
    log = drain()
    assert "queues=default,shop-emails" in log
    assert shop.email.get_result(emailed.id).return_value == "confirmation for order 3"
    assert shop.decline_once.get_result(other.id).status == "READY"  # not this worker's


def test_a_failing_task_is_retried_then_fails(shop: ModuleType, django_db: Any) -> None:
    from django.tasks.base import TaskResultStatus

    result = shop.decline.enqueue(4)
    drain()
    result.refresh()
    # The first attempt failed; the second waits for its backoff.
    assert result.status == TaskResultStatus.READY and result.attempts == 1
    [error] = result.errors
    assert error.exception_class is shop.PaymentDeclined
    assert "card declined for order 4" in error.traceback
    assert 'tasks.py", line' in error.traceback

    django_db.execute("UPDATE asyncq_jobs SET run_at = now()")  # the backoff is over
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2
    assert result.finished_at is not None
    assert [e.exception_class for e in result.errors] == [shop.PaymentDeclined]
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_with_max_attempts_1_a_failing_task_fails_at_once(shop: ModuleType, django_db: Any) -> None:
    result = shop.decline_once.enqueue(5)
    log = drain("--backend", "once")
    assert "queues=once" in log and "failed for good after attempt 1 of 1" in log
    result.refresh()
    assert result.status == "FAILED" and result.attempts == 1
    assert result.errors[0].exception_class is shop.PaymentDeclined


def test_a_return_value_that_is_not_json_fails_the_task(shop: ModuleType, django_db: Any) -> None:
    result = shop.returns_a_date.enqueue()
    drain("--backend", "once")
    result.refresh()
    assert result.status == "FAILED"
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "return value of tests.django.project.shop.tasks.returns_a_date is not JSON" in (
        error.traceback
    )


def test_a_task_that_takes_its_context(shop: ModuleType, django_db: Any) -> None:
    result = shop.with_context.enqueue("hello")
    drain()
    result.refresh()
    assert result.return_value == {
        "id": result.id,
        "attempt": 1,
        "note": "hello",
        "args": ["hello"],
    }


def test_a_cancelled_job_is_a_failed_task(shop: ModuleType, django_db: Any) -> None:
    import anyio
    from django.tasks import default_task_backend

    import asyncq

    result = shop.confirm.enqueue(6)

    async def cancel() -> dict[int, str]:
        async with default_task_backend.make_app() as app:
            return await app.cancel(int(result.id))

    assert anyio.run(cancel) == {int(result.id): "cancelled"}
    result.refresh()
    assert result.status == "FAILED" and result.finished_at is not None
    [error] = result.errors
    assert error.exception_class is asyncq.JobCancelled
    assert "was cancelled" in error.traceback


def test_the_asyncq_command_runs_the_projects_worker(shop: ModuleType, django_db: Any) -> None:
    """``asyncq worker asyncq.contrib.django:app``, Django set up by reading ``app``."""
    result = shop.email.enqueue(10)
    log = run_worker(
        "asyncq", "worker", "asyncq.contrib.django:app", "--queue", "shop-emails", "--drain"
    ).stderr
    assert "1 claimed, 1 done" in log
    assert shop.email.get_result(result.id).return_value == "confirmation for order 10"


def test_the_runner_closes_its_threads_old_connections(shop: ModuleType, django_db: Any) -> None:
    """Around each job, as around a request: ``close_old_connections`` (CONN_MAX_AGE is
    0 here, so the connection the task used is closed after it)."""
    from django.db import connection

    from asyncq.contrib.django import runner
    from asyncq.job import Job, reset_current_job, set_current_job

    placed = order()
    connection.ensure_connection()
    assert connection.connection is not None
    token = set_current_job(Job(1, runner.SYNC_TASK, "default", "{}", 1, 1, 1), "w")
    try:
        returned = runner.run(shop.confirm.module_path, [placed.pk], {}, "default", "default", 0)
    finally:
        reset_current_job(token)
    assert returned == {"order": placed.pk, "thread": "MainThread"}
    assert connection.connection is None


def test_the_runner_sends_djangos_signals(shop: ModuleType, django_db: Any) -> None:
    """``task_started`` and ``task_finished``, with the attempt's result: READY after a
    failed attempt that will be retried, FAILED after the last one."""
    from django.tasks.signals import task_finished, task_started

    from asyncq.contrib.django import runner
    from asyncq.job import Job, reset_current_job, set_current_job

    seen: list[tuple[str, str, int, list[str]]] = []

    def started(sender: type, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.status, task_result.attempts, []))

    def finished(sender: type, task_result: Any, **kwargs: Any) -> None:
        paths = [e.exception_class_path for e in task_result.errors]
        seen.append(("finished", task_result.status, task_result.attempts, paths))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        for attempt in (1, 2):
            token = set_current_job(
                Job(9, runner.SYNC_TASK, "default", "{}", attempt, 2, attempt), "w"
            )
            try:
                with pytest.raises(shop.PaymentDeclined):
                    runner.run(shop.decline.module_path, [1], {}, "default", "default", 0)
            finally:
                reset_current_job(token)
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    declined = "tests.django.project.shop.tasks.PaymentDeclined"
    assert seen == [
        ("started", "RUNNING", 1, []),
        ("finished", "READY", 1, [declined]),
        ("started", "RUNNING", 2, []),
        ("finished", "FAILED", 2, [declined]),
    ]
