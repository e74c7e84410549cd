"""`App.rebind`: what `asyncq.testing` binds a user's App to a test schema with."""

from __future__ import annotations

import pytest

import asyncq


def test_rebind_moves_every_part_of_the_app_to_the_schema() -> None:
    app = asyncq.App("postgresql:///one")

    @app.task
    async def send(n: int) -> None: ...

    app.rebind(dsn="postgresql:///two", schema="tests_a")
    assert (app.dsn_argument, app.schema) == ("postgresql:///two", "tests_a")
    assert app.store.schema == "tests_a"
    assert app.writer.store is app.store and app.results.store is app.store
    assert send.writer is app.writer
    assert '"tests_a"."asyncq_jobs"' in app.store.q["insert_job_now"]
    app.rebind(dsn=None, schema=None)
    assert (app.dsn_argument, app.schema, app.store.schema) == (None, None, None)
    assert not app.is_open


@pytest.mark.parametrize("schema", ["Upper", "pg_x", "a-b", "", 3])
def test_rebind_refuses_a_bad_schema(schema: object) -> None:
    with pytest.raises(asyncq.ConfigurationError, match="schema must be"):
        asyncq.App().rebind(dsn=None, schema=schema)  # type: ignore[arg-type]
