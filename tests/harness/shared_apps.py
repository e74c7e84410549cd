"""Apps that share one jobs table, for the tests of workers that meet tasks they do not
know: two Apps of different services (``billing``, ``shipping``), and two versions of one
(``orders_v1`` knows `orders.place`; ``orders_v2`` also `orders.notify`, added by a
deploy). Every execution appends ``start`` to the ledger (`tests.harness.ledger`).

The environment sets them up as `tests.harness.app`: ``$ASYNCQ_DSN``.
"""

from __future__ import annotations

import asyncq
from tests.harness.ledger import record

billing = asyncq.App()
shipping = asyncq.App()
orders_v1 = asyncq.App()
orders_v2 = asyncq.App()


@billing.task(name="billing.charge")
async def charge(n: int) -> None:
    record("start")


@shipping.task(name="shipping.ship")
async def ship(n: int) -> None:
    record("start")


async def place(n: int) -> None:
    record("start")


orders_v1.task(name="orders.place")(place)
orders_v2.task(name="orders.place")(place)


@orders_v2.task(name="orders.notify")
async def notify(n: int) -> None:
    record("start")
