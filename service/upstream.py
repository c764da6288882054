"""Upstream: the cluster's store behind this server (read-through, write-back).

A node server asks its upstream for what it misses and forwards what it stores, so the
nodes of a cluster share kernels. The upstream is another fcache-server (`--upstream`,
fcache.cache.remote.RemoteStore, counted under tier "remote") or a Redis (`--redis`,
fcache.cache.redis.RedisStore, tier "redis"), reached through the same client as every
other fcache process: the same deadlines, checksum verification and circuit breaker.
With `count_traffic` (the Redis tier, whose counters the server reports on their own)
reads count hits, misses and bytes_read, and write-backs puts and bytes_written, under
the upstream's own tier.

Failure contract: the upstream is an optimization. A failed or refused read is a miss;
a failed write is dropped. Writes go through a bounded queue drained by one background
task, so a slow upstream never slows a Put; when the queue is full a write is dropped
and counted as an error. The queue holds keys, not artifacts: the writer reads each
from the store (`read`) when it sends it, so write-backs hold one artifact at a time,
not up to WRITE_QUEUE of them outside the server's memory budget. `flushed(key)` waits
until no write-back of key is queued or running (fcache-server's Redis leases are
released only then, service.cluster). Event-loop only; the blocking client calls run on
`pool`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Protocol, TypeVar

from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats

log = logging.getLogger(__name__)

T = TypeVar("T")
WRITE_QUEUE = 1024


class Tier(Protocol):
    """What an upstream client offers (RemoteStore and RedisStore do): blocking calls that
    raise StoreUnavailable, having counted their own failures."""

    name: str
    address: str

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...

    def find_missing(self, keys: Iterable[str]) -> list[str]: ...

    def close(self) -> None: ...


class Upstream:
    def __init__(
        self,
        remote: Tier,
        pool: Executor,
        stats: CacheStats,
        tier: str,
        read: Callable[[str], bytes | None],
        count_traffic: bool = False,
    ) -> None:
        self.address = remote.address
        self.name = remote.name
        self._remote = remote
        self._read = read
        self._pool = pool
        self._stats = stats
        self._tier = tier
        self._count_traffic = count_traffic
        self._queue: asyncio.Queue[str] = asyncio.Queue(WRITE_QUEUE)
        self._writer: asyncio.Task[None] | None = None
        self._dropped_warned = False
        # Write-backs queued or running, by key, and who waits for them to end.
        self._pending: dict[str, int] = {}
        self._flushed: dict[str, asyncio.Event] = {}

    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(self._write_back())

    async def get(self, key: str) -> bytes | None:
        """The upstream's verified bytes for key, or None (absent, or the upstream failed)."""
        try:
            data = await self._call(self._remote.get, key)
        except StoreUnavailable as exc:
            log.debug("upstream read of %s failed: %s", key, exc)
            return None
        if self._count_traffic:
            if data is None:
                self._stats.add(self.name, misses=1)
            else:
                self._stats.add(self.name, hits=1, bytes_read=len(data))
        return data

    async def missing(self, keys: list[str]) -> set[str]:
        """The keys the upstream lacks; all of them if it cannot be asked."""
        try:
            return set(await self._call(self._remote.find_missing, keys))
        except StoreUnavailable as exc:
            log.debug("upstream FindMissing failed: %s", exc)
            return set(keys)

    def write_back(self, key: str) -> None:
        """Send the stored artifact of key to the upstream, soon (it is read then)."""
        try:
            self._queue.put_nowait(key)
            self._pending[key] = self._pending.get(key, 0) + 1
        except asyncio.QueueFull:
            self._stats.add(self._counted_as, errors=1)
            if not self._dropped_warned:
                self._dropped_warned = True
                log.warning("upstream %s falls behind; dropping write-backs", self.address)

    async def close(self, grace_s: float) -> None:
        """Give queued writes up to grace_s to reach the upstream, then stop."""
        if self._writer is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), grace_s)
        except asyncio.TimeoutError:
            log.warning(
                "upstream %s: %d write-backs dropped at shutdown", self.address, self._queue.qsize()
            )
        self._writer.cancel()
        for event in self._flushed.values():  # nothing more will be written back
            event.set()
        self._remote.close()

    def refused(self, counter: str) -> None:
        """Count an entry it served that this server refuses (`corrupt`, `unverified`,
        `incompatible`): under the upstream's own tier when it counts its traffic (Redis),
        else under the server's."""
        self._stats.add(self._counted_as, **{counter: 1})

    @property
    def _counted_as(self) -> str:
        return self.name if self._count_traffic else self._tier

    async def flushed(self, key: str) -> None:
        """Return once no write-back of key is queued or running (at once if none is)."""
        if self._pending.get(key):
            await self._flushed.setdefault(key, asyncio.Event()).wait()

    async def _write_back(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                data = await self._call(self._read, key)
                if data is not None:  # evicted meanwhile: nothing to send
                    await self._call(self._remote.put, key, data)
                    if self._count_traffic:
                        self._stats.add(self.name, puts=1, bytes_written=len(data))
            except StoreUnavailable as exc:
                log.debug("upstream write of %s failed: %s", key, exc)
            finally:
                self._queue.task_done()
                self._done(key)

    def _done(self, key: str) -> None:
        left = self._pending.get(key, 1) - 1
        if left > 0:
            self._pending[key] = left
            return
        self._pending.pop(key, None)
        event = self._flushed.pop(key, None)
        if event is not None:
            event.set()

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
