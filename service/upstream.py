"""Upstream: another fcache-server behind this one (read-through, write-back).

A node server asks its upstream for what it misses and forwards what it stores, so the
nodes of a cluster share kernels. The upstream is reached through the same client as
every other fcache process (fcache.cache.remote.RemoteStore): the same deadlines,
checksum verification and circuit breaker, counted under tier "remote".

Failure contract: the upstream is an optimization. A failed or refused read is a miss;
a failed write is dropped. Writes go through a bounded queue drained by one background
task, so a slow upstream never slows a Put; when the queue is full a write is dropped
and counted as an error. The queue holds keys, not artifacts: the writer reads each
from the store (`read`) when it sends it, so write-backs hold one artifact at a time,
not up to WRITE_QUEUE of them outside the server's memory budget. Event-loop only; the
blocking client calls run on `pool`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

from fcache.cache.remote import RemoteStore
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats

log = logging.getLogger(__name__)

T = TypeVar("T")
WRITE_QUEUE = 1024


class Upstream:
    def __init__(
        self,
        remote: RemoteStore,
        pool: Executor,
        stats: CacheStats,
        tier: str,
        read: Callable[[str], bytes | None],
    ) -> None:
        self.address = remote.address
        self._remote = remote
        self._read = read
        self._pool = pool
        self._stats = stats
        self._tier = tier
        self._queue: asyncio.Queue[str] = asyncio.Queue(WRITE_QUEUE)
        self._writer: asyncio.Task[None] | None = None
        self._dropped_warned = False

    def start(self) -> None:
        self._writer = asyncio.get_running_loop().create_task(self._write_back())

    async def get(self, key: str) -> bytes | None:
        """The upstream's verified bytes for key, or None (absent, or the upstream failed)."""
        try:
            return await self._call(self._remote.get, key)
        except StoreUnavailable as exc:
            log.debug("upstream read of %s failed: %s", key, exc)
            return None

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
        except asyncio.QueueFull:
            self._stats.add(self._tier, errors=1)
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
        self._remote.close()

    async def _write_back(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                data = await self._call(self._read, key)
                if data is not None:  # evicted meanwhile: nothing to send
                    await self._call(self._remote.put, key, data)
            except StoreUnavailable as exc:
                log.debug("upstream write of %s failed: %s", key, exc)
            finally:
                self._queue.task_done()

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
