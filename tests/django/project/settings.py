"""A Django project whose tasks run on asyncq: the settings of tests/django.

The database comes from ``$ASYNCQ_DJANGO_DSN`` (tests/django/conftest.py makes one per
test run).
"""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["ASYNCQ_DJANGO_DSN"])

SECRET_KEY = "asyncq tests: not a secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "Europe/Paris"
INSTALLED_APPS = ["asyncq.contrib.django", "tests.django.project.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    },
    # Not PostgreSQL: a backend that writes here fails the system checks.
    "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
TASKS = {
    "default": {
        "BACKEND": "asyncq.contrib.django.AsyncqBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"queue_map": {"emails": "shop-emails"}, "max_attempts": 2},
    },
    # At most one attempt per job.
    "once": {
        "BACKEND": "asyncq.contrib.django.AsyncqBackend",
        "QUEUES": ["once"],
        "OPTIONS": {"max_attempts": 1},
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
