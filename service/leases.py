"""LeaseTable: single flight per key among the callers of one server.

Of all callers that miss on a key, the first holds its lease (it compiles the region),
the others wait in arrival order. Every caller has a `Ticket` whose events say what to
do next:

    Granted       you hold the lease now: compile, then Put
    Delivered     the artifact landed (someone's Put); here are its bytes
    Fulfilled     (to the holder) the key's Put landed; your lease is over
    Closed        the server is shutting down

The table never times anything out and never sees the network: the Lease call that owns
a ticket decides how long to wait or hold, and calls `leave` when it ends for any reason
(its caller cancelled or disconnected, a deadline passed, the artifact was served).
Leaving as holder passes the lease to the next waiter, so a holder that dies mid-compile
costs the others one compile's delay, not a deadlock.

Not thread-safe: use it from the server's event loop only.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from dataclasses import dataclass, field

from service.storage import Served


class Granted:
    """You hold the lease."""


class Fulfilled:
    """The key's artifact was stored; the holder's lease is over."""


class Closed:
    """The table was closed (server shutdown)."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """The key's artifact landed; here it is."""

    served: Served


Event = Granted | Fulfilled | Closed | Delivered
GRANTED, FULFILLED, CLOSED = Granted(), Fulfilled(), Closed()


@dataclass(eq=False)
class Ticket:
    """One caller's place in a key's line. `holding` is whether it holds the lease now."""

    key: str
    lease_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    holding: bool = False
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)


@dataclass(eq=False)
class _Line:
    holder: Ticket | None = None
    waiters: deque[Ticket] = field(default_factory=deque)


class LeaseTable:
    def __init__(self) -> None:
        self._lines: dict[str, _Line] = {}
        self._closed = False

    def join(self, key: str) -> Ticket:
        """A ticket for key: granted at once if nobody holds the lease, else waiting."""
        ticket = Ticket(key)
        if self._closed:
            ticket.events.put_nowait(CLOSED)
            return ticket
        line = self._lines.setdefault(key, _Line())
        if line.holder is None:
            self._grant(line, ticket)
        else:
            line.waiters.append(ticket)
        return ticket

    def waiters(self, key: str) -> int:
        line = self._lines.get(key)
        return len(line.waiters) if line else 0

    def leave(self, ticket: Ticket) -> None:
        """Ticket's call has ended. A holder's lease passes to the next waiter. Idempotent."""
        line = self._lines.get(ticket.key)
        if line is None:
            return
        if line.holder is ticket:
            line.holder = None
            if line.waiters:
                self._grant(line, line.waiters.popleft())
        elif ticket in line.waiters:
            line.waiters.remove(ticket)
        if line.holder is None and not line.waiters:
            del self._lines[ticket.key]

    def fulfil(self, key: str, served: Served) -> None:
        """The key's artifact is stored: hand it to every waiter, end the holder's lease."""
        line = self._lines.pop(key, None)
        if line is None:
            return
        delivered = Delivered(served)
        for waiter in line.waiters:
            waiter.events.put_nowait(delivered)
        if line.holder is not None:
            line.holder.holding = False
            line.holder.events.put_nowait(FULFILLED)

    def has(self, key: str) -> bool:
        return key in self._lines

    def close(self) -> None:
        """Tell every ticket the server is going away; later joins are closed at once."""
        self._closed = True
        lines, self._lines = self._lines, {}
        for line in lines.values():
            for ticket in (line.holder, *line.waiters):
                if ticket is not None:
                    ticket.holding = False
                    ticket.events.put_nowait(CLOSED)

    @property
    def active_leases(self) -> int:
        return sum(1 for line in self._lines.values() if line.holder is not None)

    @property
    def waiting_callers(self) -> int:
        return sum(len(line.waiters) for line in self._lines.values())

    @staticmethod
    def _grant(line: _Line, ticket: Ticket) -> None:
        line.holder = ticket
        ticket.holding = True
        ticket.events.put_nowait(GRANTED)
