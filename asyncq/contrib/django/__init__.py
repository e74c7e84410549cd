"""asyncq as the backend of Django's tasks framework (``django.tasks``, Django 6).

```python
TASKS = {"default": {"BACKEND": "asyncq.contrib.django.AsyncqBackend"}}
INSTALLED_APPS = [..., "asyncq.contrib.django"]  # migrations and commands
```

`AsyncqBackend` writes each enqueued task as an asyncq job on Django's own database
connection, so it commits or rolls back with ``transaction.atomic()``; results come back
through ``django.tasks``' result API. ``python manage.py migrate`` creates asyncq's
tables, and ``python manage.py asyncq_worker`` runs a worker.

``asyncq.contrib.django:app`` is the `asyncq.App` of the backend ``"default"`` (another
with ``$ASYNCQ_DJANGO_BACKEND``), for the ``asyncq`` command: ``asyncq jobs
asyncq.contrib.django:app`` with ``$DJANGO_SETTINGS_MODULE`` set. Reading it sets Django
up if it is not.

Nothing here is imported by ``import asyncq``; `AsyncqBackend` and ``app`` import
Django when first read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncq.app import App
    from asyncq.contrib.django.backend import AsyncqBackend

    app: App

__all__ = ["AsyncqBackend"]  # not app: reading it sets Django up


def __getattr__(name: str) -> Any:
    if name == "AsyncqBackend":
        from asyncq.contrib.django.backend import AsyncqBackend

        return AsyncqBackend
    if name == "app":
        from asyncq.contrib.django.setup import worker_app

        built = worker_app()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
