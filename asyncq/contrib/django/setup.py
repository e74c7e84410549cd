"""``asyncq.contrib.django:app``: the App of a ``TASKS`` backend, Django set up first."""

from __future__ import annotations

import os

from asyncq.app import App
from asyncq.errors import ConfigurationError

BACKEND_VARIABLE = "ASYNCQ_DJANGO_BACKEND"


def worker_app(alias: str | None = None) -> App:
    """A new `asyncq.App` for the asyncq backend ``alias`` of ``TASKS`` (default:
    ``$ASYNCQ_DJANGO_BACKEND``, else ``"default"``), after ``django.setup()`` if Django
    is not set up yet. `ConfigurationError` says what is missing."""
    try:
        import django
        from django.conf import settings
    except ImportError:
        raise ConfigurationError(
            "asyncq.contrib.django needs Django 6: pip install 'asyncq[django]'"
        ) from None
    if django.VERSION < (6, 0):
        raise ConfigurationError(
            f"asyncq.contrib.django needs Django 6 (django.tasks), not {django.__version__}"
        )
    from django.apps import apps

    if not apps.ready:
        if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
            raise ConfigurationError(
                "asyncq.contrib.django:app needs Django's settings: set DJANGO_SETTINGS_MODULE"
            )
        try:
            django.setup()
        except ImportError as exc:
            raise ConfigurationError(f"Django could not be set up: {exc}") from None

    from django.core.exceptions import ImproperlyConfigured
    from django.tasks import task_backends

    from asyncq.contrib.django.backend import AsyncqBackend

    alias = alias or os.environ.get(BACKEND_VARIABLE) or "default"
    try:
        backend = task_backends[alias]
    except ImproperlyConfigured as exc:  # InvalidTaskBackend is one
        raise ConfigurationError(f"TASKS[{alias!r}]: {exc}") from None
    if not isinstance(backend, AsyncqBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is a {type(backend).__module__}.{type(backend).__qualname__},"
            " not asyncq.contrib.django.AsyncqBackend"
        )
    try:
        return backend.make_app()
    except ImproperlyConfigured as exc:
        raise ConfigurationError(str(exc)) from None
