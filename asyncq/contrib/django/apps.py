"""The Django app ``asyncq.contrib.django``: migrations that create asyncq's tables, and
the commands ``asyncq_worker`` and ``asyncq_migrate``."""

from __future__ import annotations

from django.apps import AppConfig


class AsyncqConfig(AppConfig):
    """asyncq in ``INSTALLED_APPS``."""

    name = "asyncq.contrib.django"
    label = "asyncq"
    verbose_name = "asyncq"
