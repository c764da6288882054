"""ClusterLeases: single flight across the nodes that share one Redis (`--redis`).

A server's LeaseTable (service.leases) makes one of its own callers compile a key. With a
Redis, that caller must also hold the key's lease in Redis (fcache.cache.redis.leases)
before it is told to compile, so that of all nodes missing the key at once one compiles
it. CacheServicer asks, for a caller its table granted and whose key no tier holds:

    claim(ticket)        True: grant now (this node took the Redis lease on the ticket's
                         behalf, or Redis cannot be asked: compiling on two nodes is only
                         slower). Bytes: the artifact, which landed in Redis just before
                         the lease was taken (the lease is given back). False: another node
                         holds it; the caller is told to wait, and then
    wait(ticket, until)  polls Redis: the other node's artifact (bytes, checked against
                         their frame; the servicer verifies and keeps them), or None once
                         this node took the lease over (its holder released it without a
                         put, or died and it lapsed), the wait ran out, or Redis failed:
                         grant then.
    release(ticket)      when the ticket's call ends. If the ticket's Put was stored, its
                         write-back to Redis lands first (Upstream.flushed): a node waiting
                         on the lease then finds the artifact, never a free lease and no
                         artifact (which would make it compile the region again).

The lease is renewed by the store while held (its ttl is `--redis-lease-ttl`); a node
that dies stops renewing, and another node's waiting caller takes over within the ttl.
Redis's failures are counted by the store (tier "redis") and never fail a call. Event-loop
only: the blocking Redis calls run on `pool`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from fcache.cache.redis import RedisStore
from fcache.cache.redis.leases import POLL_FIRST_S, POLL_MAX_S
from fcache.cache.store import LeaseGrant
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats
from service.leases import Ticket
from service.upstream import Upstream

log = logging.getLogger(__name__)

T = TypeVar("T")


class ClusterLeases:
    def __init__(
        self, store: RedisStore, upstream: Upstream, pool: Executor, stats: CacheStats
    ) -> None:
        self.upstream = upstream
        self.store = store
        self._store = store
        self._pool = pool
        self._stats = stats
        self._held: dict[str, LeaseGrant] = {}  # ticket.lease_id -> the Redis lease
        self._releasing: set[asyncio.Task[None]] = set()

    async def claim(self, ticket: Ticket) -> bool | bytes:
        """True: grant the ticket now; False: another node holds the lease (wait); bytes:
        the artifact, which landed in Redis just before this node took the lease."""
        try:
            return await self._take(ticket)
        except StoreUnavailable:
            return True

    async def wait(self, ticket: Ticket, until: float) -> bytes | None:
        """The artifact another node put, or None when the ticket should be granted: this
        node holds the lease now, or `until` (event-loop time) passed, or Redis failed."""
        self._stats.add(self._store.name, lease_waits=1)
        loop = asyncio.get_running_loop()
        delay = POLL_FIRST_S
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX_S)
            try:
                data = await self._run(self._store.get, ticket.key)
                taken = self._fetched(data) if data is not None else await self._take(ticket)
            except StoreUnavailable:
                return None
            if taken is True:
                return None
            if isinstance(taken, bytes):
                return taken
        return None

    async def _take(self, ticket: Ticket) -> bool | bytes:
        """Take the key's Redis lease for the ticket if it is free (True), unless the
        artifact landed meanwhile (its bytes, the lease given back); False if another node
        holds it. Raises StoreUnavailable."""
        grant = await self._run(self._store.try_lease, ticket.key)
        if grant is None:
            return False
        # Recorded first: if the next call fails, the lease goes when the ticket's call ends.
        self._held[ticket.lease_id] = grant
        data = await self._run(self._store.get, ticket.key)
        if data is None:
            return True
        self._held.pop(ticket.lease_id, None)
        self._schedule(grant)
        return self._fetched(data)

    def _fetched(self, data: bytes) -> bytes:
        self._stats.add(self._store.name, hits=1, bytes_read=len(data))
        return data

    def release(self, ticket: Ticket) -> None:
        """The ticket's call ended: give its Redis lease up, if it holds one, once the
        key's write-back (if any) has landed. Returns at once."""
        grant = self._held.pop(ticket.lease_id, None)
        if grant is not None:
            self._schedule(grant)

    def _schedule(self, grant: LeaseGrant) -> None:
        task = asyncio.get_running_loop().create_task(self._release(grant))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def close(self, grace_s: float) -> None:
        """Give pending releases up to grace_s (the leases lapse by themselves after)."""
        if self._releasing:
            await asyncio.wait(list(self._releasing), timeout=grace_s)

    async def _release(self, grant: LeaseGrant) -> None:
        await self.upstream.flushed(grant.key)
        try:
            await self._run(self._store.release, grant)
        except StoreUnavailable as exc:  # counted; the lease lapses within its ttl
            log.debug("Redis lease of %s not released: %s", grant.key, exc)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
