"""The shop's tasks: plain functions (run in the worker's threads) and a coroutine
function (run on its event loop)."""

import threading
from datetime import datetime

from django.db import transaction
from django.tasks import TaskContext, task

from tests.django.project.shop.models import Order


class PaymentDeclined(Exception):
    pass


@task
def confirm(order_id: int) -> dict[str, object]:
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        order.confirmations += 1
        order.save()
    return {"order": order_id, "thread": threading.current_thread().name}


@task(queue_name="emails")
def email(order_id: int, template: str = "confirmation") -> str:
    return f"{template} for order {order_id}"


@task
async def pay(order_id: int) -> dict[str, object]:
    updated = await Order.objects.filter(pk=order_id).aupdate(paid=True)
    return {"updated": updated, "thread": threading.current_thread().name}


@task
def decline(order_id: int) -> None:
    raise PaymentDeclined(f"card declined for order {order_id}")


@task(backend="once", queue_name="once")
def decline_once(order_id: int) -> None:
    raise PaymentDeclined(f"card declined for order {order_id}")


@task(backend="once", queue_name="once")
def returns_a_date() -> datetime:
    return datetime(2030, 1, 1)


@task(takes_context=True)
def with_context(context: TaskContext, note: str) -> dict[str, object]:
    return {
        "id": context.task_result.id,
        "attempt": context.attempt,
        "note": note,
        "args": context.task_result.args,
    }
