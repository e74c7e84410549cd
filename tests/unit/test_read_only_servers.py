"""Which DSNs keep connections to a read-only server (`asyncq.pools`): only those that
ask for one. The rest close such a connection after its call, for the pool to replace
it (``tests/faults/test_failover.py`` shows it against real servers)."""

from __future__ import annotations

import pytest

from asyncq.pools import _wants_read_only


@pytest.mark.parametrize(
    ("dsn", "keeps"),
    [
        ("postgresql://u@a:1,b:2/db?target_session_attrs=read-write", False),
        ("host=a,b port=1,2 dbname=db target_session_attrs=primary", False),
        ("host=a dbname=db", False),  # libpq's default, any: a proxy or an address may move
        ("host=a dbname=db target_session_attrs=any", False),
        ("host=a,b dbname=db target_session_attrs=read-only", True),
        ("postgresql://u@a,b/db?target_session_attrs=standby", True),
        ("host=a,b dbname=db target_session_attrs=prefer-standby", True),
        ("not a dsn = = =", False),
    ],
)
def test_only_a_dsn_that_asks_for_a_read_only_server_keeps_one(dsn: str, keeps: bool) -> None:
    assert _wants_read_only(dsn) is keeps
