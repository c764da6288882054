"""LeaseTable on its own: grants, lines, hand-over, fulfilment and shutdown."""

from __future__ import annotations

import asyncio

from fcache.protocol import wire
from service.leases import CLOSED, FULFILLED, GRANTED, Delivered, LeaseTable
from service.storage import Served

KEY = "0" * 32


def _served() -> Served:
    return Served(wire.blob_info(KEY, b"data"), b"data", 1.0)


def _events(ticket) -> list[object]:  # type: ignore[no-untyped-def]
    events = []
    while not ticket.events.empty():
        events.append(ticket.events.get_nowait())
    return events


def test_the_first_is_granted_the_rest_wait_in_order() -> None:
    async def run() -> None:
        table = LeaseTable()
        first, second, third = table.join(KEY), table.join(KEY), table.join(KEY)
        assert first.holding and not second.holding and not third.holding
        assert _events(first) == [GRANTED] and _events(second) == []
        assert (table.active_leases, table.waiting_callers, table.waiters(KEY)) == (1, 2, 2)
        table.leave(first)
        assert second.holding and _events(second) == [GRANTED]
        table.leave(third)  # a waiter that gave up
        table.leave(second)
        assert not table.has(KEY) and table.waiting_callers == 0

    asyncio.run(run())


def test_fulfil_delivers_to_waiters_and_ends_the_holder() -> None:
    async def run() -> None:
        table = LeaseTable()
        holder, waiter = table.join(KEY), table.join(KEY)
        _events(holder)
        served = _served()
        table.fulfil(KEY, served)
        assert _events(holder) == [FULFILLED] and not holder.holding
        assert _events(waiter) == [Delivered(served)]
        table.leave(holder)  # idempotent once the line is gone
        assert not table.has(KEY)

    asyncio.run(run())


def test_close_ends_every_ticket_and_refuses_new_ones() -> None:
    async def run() -> None:
        table = LeaseTable()
        holder, waiter = table.join(KEY), table.join(KEY)
        _events(holder)
        table.close()
        assert _events(holder) == [CLOSED] and _events(waiter) == [CLOSED]
        assert _events(table.join(KEY)) == [CLOSED]

    asyncio.run(run())
