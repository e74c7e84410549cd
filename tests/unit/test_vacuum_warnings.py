"""`asyncq.admin.vacuum_warnings` as a table: which health figures warn, and of what."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from asyncq.admin import TableStats, vacuum_warnings

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def stats(
    *,
    live: int,
    dead: int,
    vacuumed_ago: timedelta | None,
    autovacuum: bool = True,
    autovacuum_off: tuple[str, ...] = (),
) -> TableStats:
    return TableStats(
        rows={},
        live_tuples=live,
        dead_tuples=dead,
        inserts=0,
        updates=0,
        hot_updates=0,
        deletes=0,
        last_vacuum=None if vacuumed_ago is None else NOW - vacuumed_ago,
        last_autovacuum=None,
        last_analyze=None,
        last_autoanalyze=None,
        vacuum_count=0,
        autovacuum_count=0,
        autovacuum=autovacuum,
        autovacuum_off=list(autovacuum_off),
        now=NOW,
        table_bytes=0,
        index_bytes=0,
        total_bytes=0,
        index_sizes={},
        horizon=None,
        throughput=[],
    )


SECOND = timedelta(seconds=1)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("live", "dead", "vacuumed_ago", "behind"),
    [
        (0, 0, None, False),
        (1000, 10000, SECOND, True),  # ten dead per live, a second after a VACUUM
        (1000, 4000, SECOND, False),  # four per live: not yet
        (100, 900, SECOND, False),  # nine per live, but too few to matter
        (100, 1000, SECOND, True),
        (100_000, 50_000, HOUR, False),  # fewer dead than live
        (5_000, 9_000, HOUR, False),  # under the floor of the late vacuum
        (5_000, 12_000, HOUR, True),  # outnumbering the live, no vacuum for an hour
        (5_000, 12_000, SECOND, False),  # the same, just vacuumed
        (5_000, 12_000, None, True),  # never vacuumed
    ],
)
def test_dead_row_versions(
    live: int, dead: int, vacuumed_ago: timedelta | None, behind: bool
) -> None:
    found = vacuum_warnings(
        stats(live=live, dead=dead, vacuumed_ago=vacuumed_ago), max_snapshot_age=300
    )
    assert [w.startswith("vacuum is falling behind") for w in found] == ([True] if behind else [])
    if behind:
        assert f"{dead} dead row versions against {live} live ones" in found[0]
        assert f"({dead / max(live, 1):.2f} per live row)" in found[0]


def test_autovacuum_off_on_the_server() -> None:
    [found] = vacuum_warnings(
        stats(live=0, dead=0, vacuumed_ago=None, autovacuum=False), max_snapshot_age=300
    )
    assert found.startswith("autovacuum is off on this server (autovacuum = off)")


def test_autovacuum_off_for_asyncqs_tables() -> None:
    [found] = vacuum_warnings(
        stats(live=0, dead=0, vacuumed_ago=None, autovacuum_off=("asyncq_jobs", "asyncq_queues")),
        max_snapshot_age=300,
    )
    assert found.startswith("autovacuum is off for asyncq_jobs, asyncq_queues")
    assert "ALTER TABLE ... RESET (autovacuum_enabled)" in found
