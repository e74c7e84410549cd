"""Which failures of a database call are worth another try, and how long to wait for it.

Transient: the connection or the server is in trouble (lost, restarting, out of
connections or of disk, a failover leaving us on a standby), or the statement lost a
race it may win next time (a deadlock, a serialization failure, a lock or statement
timeout). Every other database error is permanent: the same statement with the same
values fails again (a value out of range, a constraint, a missing column or grant),
so retrying it only wedges whatever waits behind it. So are the few that psycopg counts
among its ``OperationalError`` but that no retry gets past: a program limit (class 54:
an index row too large, a statement too complex, too many columns or arguments) and a
setting that cannot be changed now.

`TRANSIENT_ERRORS` are the types a transient error is one of; `is_transient` decides:
``except TRANSIENT_ERRORS as exc: if not is_transient(exc): raise``.
"""

from __future__ import annotations

import math
import random

import psycopg
from psycopg import errors

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,  # connections, 40xxx, 53xxx, 55xxx, 57xxx, 58xxx; PoolTimeout
    errors.ReadOnlySqlTransaction,  # connected to a standby: reconnect, do not give up
    errors.IdleInTransactionSessionTimeout,
    OSError,
    TimeoutError,
)

# SQLSTATEs of OperationalError (a class by its first two characters) that a retry meets
# again: program_limit_exceeded and its kin, cant_change_runtime_param.
PERMANENT_STATES = ("54", "55P02")


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith(PERMANENT_STATES):
        return False
    return isinstance(exc, TRANSIENT_ERRORS)


def backoff_delay(failures: int, *, base: float = 0.5, cap: float = 5.0) -> float:
    """Seconds before the next try after ``failures`` in a row, with full jitter: at most
    ``cap``, so that a service is back within seconds of the database (the pools, not the
    services, keep the database from a storm of new connections)."""
    return random.uniform(base / 2, min(cap, base * math.pow(2, min(failures, 16))))
