"""The jobs table, as the harness's tests write and read it with plain SQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


def insert_jobs(
    db: psycopg.Connection[Any],
    task_name: str,
    args: Sequence[dict[str, Any]],
    **columns: Any,
) -> list[int]:
    """Enqueue jobs with plain SQL, as the contract allows; returns their ids in order."""
    names = ", ".join(columns)
    values = ", ".join(f"%({name})s" for name in columns)
    query = (
        f"INSERT INTO asyncq_jobs (task_name, args{', ' if columns else ''}{names})"
        f" SELECT %(task_name)s, a{', ' if columns else ''}{values}"
        " FROM jsonb_array_elements(%(args)s) AS a RETURNING id"
    )
    params = {"task_name": task_name, "args": Jsonb(list(args)), **columns}
    return sorted(row[0] for row in db.execute(query, params).fetchall())


def job_row(db: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with db.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM asyncq_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} is gone"
    return row


def status_of(db: psycopg.Connection[Any], job_id: int) -> str:
    return str(job_row(db, job_id)["status"])
