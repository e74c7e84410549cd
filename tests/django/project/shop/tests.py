"""The shop's own tests, as its developers run them: ``python -m django test
tests.django.project.shop`` (Django's test runner makes a test database, and its
migrations make asyncq's tables there). Run by tests/django/test_setup.py."""

from django.test import TestCase, override_settings

from tests.django.project.shop.models import Order
from tests.django.project.shop.tasks import confirm

IMMEDIATE = {
    "default": {
        "BACKEND": "django.tasks.backends.immediate.ImmediateBackend",
        "QUEUES": ["default", "emails"],
    }
}


class ShopTests(TestCase):
    def test_confirm_enqueues_a_job_in_the_test_database(self) -> None:
        order = Order.objects.create(item="book")
        result = confirm.enqueue(order.pk)
        self.assertEqual(confirm.get_result(result.id).status, "READY")

    @override_settings(TASKS=IMMEDIATE)
    def test_confirm_runs_at_once_with_the_immediate_backend(self) -> None:
        order = Order.objects.create(item="book")
        result = confirm.enqueue(order.pk)
        self.assertEqual(result.status, "SUCCESSFUL")
        self.assertEqual(Order.objects.get(pk=order.pk).confirmations, 1)
