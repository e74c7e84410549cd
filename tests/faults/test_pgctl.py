"""The controlled server itself: it restarts and comes back from a crash."""

from __future__ import annotations

import psycopg

from tests.faults.pgctl import ControlledPostgres


def test_controlled_server_restarts_and_recovers() -> None:
    pg = ControlledPostgres()
    try:
        pg.init()
        pg.start()
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
        pg.restart("fast")
        pg.stop("immediate")
        pg.start()
        with psycopg.connect(pg.dsn()) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        pg.destroy()
