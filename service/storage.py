"""NodeStorage: what the server stores and serves, as verified artifact envelopes.

It fronts the server's LmdbStore (fcache.cache.lmdb, the same store and layout
fcache uses locally) and, optionally, an Upstream. Every artifact is decoded as an
envelope (fcache.cache.artifact) before it is stored and again before it is served: an
upload that is not a whole, intact envelope is refused, and an entry that rotted at
rest is deleted, counted `corrupt`, and treated as absent.

Counters (the tier given): puts, bytes_written, corrupt, and errors of keeping what the
upstream sent. Hits and misses are the servicer's: only it knows what a caller got.

Event-loop only. LMDB calls and envelope checks block (fsync, hashing 64 MiB), so they
run on `pool`; concurrency among them is LMDB's (readers in parallel, one writer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

from fcache.cache import artifact
from fcache.cache.lmdb import LmdbStore
from fcache.errors import CorruptArtifact, StoreUnavailable
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats
from service.upstream import Upstream

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Served:
    """A verified artifact, ready to send: its BlobInfo is computed once, off the loop."""

    info: pb.BlobInfo
    data: bytes
    compile_seconds: float


class NodeStorage:
    def __init__(
        self,
        store: LmdbStore,
        stats: CacheStats,
        tier: str,
        pool: Executor,
        upstream: Upstream | None = None,
    ) -> None:
        self.store = store
        self.upstream = upstream
        self._stats = stats
        self._tier = tier
        self._pool = pool

    async def get(self, key: str) -> Served | None:
        """The artifact for key from the store, else from the upstream (then kept here)."""
        served = await self._run(self._load, key)
        if served is None and self.upstream is not None:
            served = await self._from_upstream(self.upstream, key)
        return served

    async def put(self, info: pb.BlobInfo, data: bytes) -> Served:
        """Verify and store an upload whose transfer was verified against `info`.

        Raises CorruptArtifact if data is not an intact envelope; StoreUnavailable if the
        store cannot take it. Returns only once the write is durable."""
        served = Served(info, data, await self._run(_verify, info.key, data))
        await self._run(self.store.put, info.key, data)
        self._stats.add(self._tier, puts=1, bytes_written=len(data))
        if self.upstream is not None:
            self.upstream.write_back(info.key, data)
        return served

    async def contains(self, key: str) -> bool:
        return await self._run(self.store.contains, key)

    async def missing(self, keys: list[str]) -> list[str]:
        """The keys a Get would miss, in request order (the upstream asked about the rest)."""
        absent = await self._run(self._absent, keys)
        if absent and self.upstream is not None:
            upstream_absent = await self.upstream.missing(absent)
            absent = [k for k in absent if k in upstream_absent]
        return absent

    async def size(self) -> tuple[int, int]:
        """(entries, bytes) of the local store."""
        return await self._run(self._size)

    def _size(self) -> tuple[int, int]:
        return len(self.store.entries()), self.store.total_bytes()

    def _absent(self, keys: list[str]) -> list[str]:
        return [k for k in keys if not self.store.contains(k)]

    def _load(self, key: str) -> Served | None:
        """Runs on the pool: read and verify; a corrupt entry is deleted and missed."""
        data = self.store.get(key)
        if data is None:
            return None
        try:
            return _served(key, data)
        except CorruptArtifact as exc:
            log.warning("dropping corrupt entry %s: %s", key, exc)
            self._stats.add(self._tier, corrupt=1)
            self.store.delete(key)
            return None

    async def _from_upstream(self, upstream: Upstream, key: str) -> Served | None:
        data = await upstream.get(key)
        if data is None:
            return None
        try:
            served = await self._run(_served, key, data)
        except CorruptArtifact as exc:
            # The transfer checksum matched, so the upstream itself holds a bad envelope.
            log.warning("upstream %s served a corrupt %s: %s", upstream.address, key, exc)
            self._stats.add(self._tier, corrupt=1)
            return None
        try:
            await self._run(self.store.put, key, data)
        except StoreUnavailable as exc:
            # Serving what the upstream sent is still right; only the local copy is lost.
            log.warning("could not keep %s from the upstream: %s", key, exc)
            self._stats.add(self._tier, errors=1)
        return served

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def _verify(key: str, data: bytes) -> float:
    """The envelope's recorded compile seconds; CorruptArtifact naming key if it is bad."""
    try:
        return artifact.decode(data).compile_seconds
    except CorruptArtifact as exc:
        raise CorruptArtifact(f"artifact {key}: {exc}") from None


def _served(key: str, data: bytes) -> Served:
    return Served(wire.blob_info(key, data), data, _verify(key, data))
