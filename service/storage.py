"""NodeStorage: what the server stores and serves, as verified artifact envelopes.

It fronts the server's LmdbStore (fcache.cache.lmdb, the same store and layout
fcache uses locally) and, optionally, an Upstream (another fcache-server, or a Redis).
Every artifact is verified before it is stored and again before it is served: decoded
as an envelope (fcache.cache.artifact) and, when the server holds the signing key
(`signer`), checked against its key's signature (fcache.cache.signing). So:

- an upload that is not a whole, intact envelope is refused (CorruptArtifact), one in a
  newer format than this server reads too (NewerFormat), and, with a signer, one whose
  signature is missing or does not match (Unverified);
- an entry that rotted at rest is deleted, counted `corrupt`, and treated as absent; with
  a signer, so is an entry that fails its signature (counted `unverified`: stored before
  the key was configured, or planted behind the server's back); an entry in a newer
  format is absent to this server but kept (counted `incompatible`);
- what the upstream sends is verified the same way before it is kept or served.

First write wins, atomically (`LmdbStore.add`: of racing Puts of one key exactly one
commits). A Put of a key already held is a duplicate (`Stored.stored` False) when both
carry the same executor and payload (the rest of the envelope, compile time say, may
differ between two compiles of one region); otherwise it is a `Conflict`: refused, the
held entry stays, logged (a warning without a signer, which cannot tell a forgery from two
producers that compiled the region at once; with one, both verified, and AOTInductor's
packages differ from compile to compile, so only information).

A plant cannot take a key hostage (issue #42): the server verifies what it can before it
lets an entry stand. A held entry that no longer verifies (with a signer) is replaced by
a verified upload; without a signer, an unsigned held entry is replaced by a signed
upload (readers refuse unsigned entries by default, so it can only be a plant or a
leftover); and an entry a reader refused is dropped when the reader `report`s it (the
Report RPC), unless the server's own key vouches for it. So the reader's own Put, which
follows its refusal, is stored rather than refused as a conflict.

Memory: uploads arrive as one buffer (a memoryview) and are checked with
`artifact.inspect`, which does not copy the payload; entries read to be served likewise.

Counters (the tier given): puts, bytes_written, corrupt, unverified, incompatible,
reported (entries dropped because a reader refused them), and errors of keeping what the
upstream sent. Hits, misses, duplicates and conflicts are the
servicer's: only it knows what a caller got.

Event-loop only. LMDB calls and envelope checks block (fsync, hashing 64 MiB), so they
run on `pool`; concurrency among them is LMDB's (readers in parallel, one writer).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

from fcache.cache import artifact
from fcache.cache.lmdb import LmdbStore
from fcache.cache.signing import Signer
from fcache.errors import CorruptArtifact, FcacheError, NewerFormat, StoreUnavailable, Unverified
from fcache.protocol import wire
from fcache.protocol._gen.fcache.v1 import cache_pb2 as pb
from fcache.stats import CacheStats
from service.upstream import Upstream

log = logging.getLogger(__name__)

T = TypeVar("T")


class Conflict(FcacheError):
    """Other contents are stored under the key: the Put is refused, the stored entry stays."""


@dataclass(frozen=True, slots=True)
class Served:
    """A verified artifact, ready to send: its BlobInfo is computed once, off the loop."""

    info: pb.BlobInfo
    data: bytes | memoryview
    compile_seconds: float


@dataclass(frozen=True, slots=True)
class Stored:
    """The outcome of an accepted Put: `stored` False when the key held it already."""

    served: Served
    stored: bool


class NodeStorage:
    def __init__(
        self,
        store: LmdbStore,
        stats: CacheStats,
        tier: str,
        pool: Executor,
        upstream: Upstream | None = None,
        signer: Signer | None = None,
    ) -> None:
        self.store = store
        self.upstream = upstream
        self.signer = signer
        self._stats = stats
        self._tier = tier
        self._pool = pool

    async def get(self, key: str) -> Served | None:
        """The artifact for key from the store, else from the upstream (then kept here)."""
        served = await self._run(self._load, key)
        if served is None and self.upstream is not None:
            served = await self._from_upstream(self.upstream, key)
        return served

    async def size_of(self, key: str) -> int | None:
        """The stored entry's size, without reading it; None if this store lacks it."""
        return await self._run(self.store.size_of, key)

    async def holds(self, info: pb.BlobInfo) -> bool:
        """Whether exactly these bytes (size and checksum) are stored under info.key."""
        return await self._run(self._holds, info)

    async def put(self, info: pb.BlobInfo, data: bytes | memoryview) -> Stored:
        """Verify and store an upload whose transfer was verified against `info`.

        Raises CorruptArtifact, NewerFormat or Unverified if data is not an envelope this
        server accepts; Conflict if other contents are stored under the key;
        StoreUnavailable (StoreFull) if the store cannot take it. Returns only once the
        write is durable, or the key holds the same artifact already."""
        stored, compile_seconds = await self._run(self._put, info.key, data)
        served = Served(info, data, compile_seconds)
        if stored:
            self._stats.add(self._tier, puts=1, bytes_written=len(data))
            if self.upstream is not None:
                self.upstream.write_back(info.key)
        return Stored(served, stored)

    async def report(self, key: str, checksum: bytes, reason: str) -> bool:
        """A reader refused the entry with this checksum under key: drop it, unless this
        server's key vouches for it (then the reader holds another key). Whether dropped."""
        return await self._run(self._report, key, checksum, reason)

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

    # -- on the pool -------------------------------------------------------------------

    def _verify(self, key: str, data: bytes | memoryview) -> artifact.Artifact:
        """The decoded envelope (its payload a view of `data`), its signature checked when
        the server holds the key; CorruptArtifact, NewerFormat or Unverified, naming the
        key, otherwise."""
        try:
            found = artifact.inspect(data)
        except CorruptArtifact as exc:
            raise CorruptArtifact(f"artifact {key}: {exc}") from None
        except NewerFormat as exc:
            raise NewerFormat(f"artifact {key}: {exc}") from None
        if self.signer is not None:
            self.signer.verify(key, found)
        return found

    def _put(self, key: str, data: bytes | memoryview) -> tuple[bool, float]:
        """(whether stored, its compile seconds). First write wins; see the module doc."""
        upload = self._verify(key, data)
        replacing: bytes | None = None
        for _ in range(3):
            current = self.store.add(key, data, replacing)
            if current is None:
                return True, upload.compile_seconds
            if current == data:
                return False, upload.compile_seconds
            try:
                held = self._verify(key, current)
            except (CorruptArtifact, Unverified) as exc:
                log.warning("replacing %s: the stored entry does not verify (%s)", key, exc)
                self._count_bad(exc)
                replacing = current
                continue
            except NewerFormat:
                return False, upload.compile_seconds  # a newer fcache's: left for its readers
            if _same_kernel(held, upload):
                return False, held.compile_seconds
            if self.signer is None and held.signature is None and upload.signature is not None:
                # No reader with a key (the default) loads an unsigned entry: a signed
                # upload replaces it rather than being refused for good.
                log.warning("replacing %s: the stored entry is unsigned, the upload signed", key)
                self._stats.add(self._tier, unverified=1)
                replacing = current
                continue
            conflict = Conflict(
                f"artifact {key}: the server holds another {held.executor} "
                f"{held.executor_version} artifact under this key (payload sha256 "
                f"{_digest(held)[:16]}, the upload's {_digest(upload)[:16]}); kept it"
            )
            if self.signer is not None:
                # Both verified: two trusted producers compiled the region at once (past a
                # lease), and the compiler is not byte-for-byte deterministic (AOTInductor
                # packages are not). Harmless: the first stays, everyone uses it.
                log.info("conflicting Put between trusted producers: %s", conflict)
            else:
                # Without the key a forgery cannot be told from a race: an alert.
                log.warning("conflicting Put (a forgery, or producers that disagree): %s", conflict)
            raise conflict
        raise StoreUnavailable(f"artifact {key}: the stored entry kept changing")

    def _report(self, key: str, checksum: bytes, reason: str) -> bool:
        data = self.store.get(key)
        if data is None or wire.checksum(data) != checksum:
            return False  # gone, or replaced since the reader read it
        if self.signer is not None:
            try:
                self._verify(key, data)
            except (CorruptArtifact, NewerFormat, Unverified):
                pass
            else:
                log.info("kept %s, reported (%s): it verifies with this server's key", key, reason)
                return False
        log.warning("dropping %s: a reader refused it (%s)", key, reason)
        self.store.delete(key)
        self._stats.add(self._tier, reported=1)
        return True

    def _holds(self, info: pb.BlobInfo) -> bool:
        if self.store.size_of(info.key) != info.size:
            return False
        data = self.store.get(info.key)
        return data is not None and wire.checksum(data) == info.checksum

    def _size(self) -> tuple[int, int]:
        return len(self.store.entries()), self.store.total_bytes()

    def _absent(self, keys: list[str]) -> list[str]:
        return [k for k in keys if not self.store.contains(k)]

    def _load(self, key: str) -> Served | None:
        """Read and verify. An entry that fails is deleted and missed, but one in a newer
        format stays (for the newer readers)."""
        # Copied out without keeping the file's pages resident (service.budget).
        data = self.store.get_unmapped(key)
        if data is None:
            return None
        try:
            found = self._verify(key, data)
        except NewerFormat as exc:
            log.info("not serving %s: %s", key, exc)
            self._stats.add(self._tier, incompatible=1)
            return None
        except (CorruptArtifact, Unverified) as exc:
            log.warning("dropping entry %s: %s", key, exc)
            self._count_bad(exc)
            self.store.delete(key)
            return None
        return Served(wire.blob_info(key, data), data, found.compile_seconds)

    def _count_bad(self, exc: Exception) -> None:
        if isinstance(exc, Unverified):
            self._stats.add(self._tier, unverified=1)
        else:
            self._stats.add(self._tier, corrupt=1)

    async def _from_upstream(self, upstream: Upstream, key: str) -> Served | None:
        data = await upstream.get(key)
        if data is None:
            return None
        return await self.adopt(upstream, key, data)

    async def adopt(self, upstream: Upstream, key: str, data: bytes) -> Served | None:
        """Bytes the upstream sent for key (a read-through, or the artifact another node
        compiled while this one waited on its Redis lease): verified as an upload is, kept
        here, and served; None, counted by the upstream, if this server refuses them."""
        try:
            found = await self._run(self._verify, key, data)
        except (CorruptArtifact, NewerFormat, Unverified) as exc:
            # The transfer checksum matched: the upstream itself holds what we refuse.
            log.warning("upstream %s served an unusable %s: %s", upstream.address, key, exc)
            if isinstance(exc, NewerFormat):
                upstream.refused("incompatible")
            else:
                upstream.refused("unverified" if isinstance(exc, Unverified) else "corrupt")
            return None
        try:
            await self._run(self.store.add, key, data)
        except StoreUnavailable as exc:
            # Serving what the upstream sent is still right; only the local copy is lost.
            log.warning("could not keep %s from the upstream: %s", key, exc)
            self._stats.add(self._tier, errors=1)
        return Served(await self._run(wire.blob_info, key, data), data, found.compile_seconds)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


def _digest(found: artifact.Artifact) -> str:
    return hashlib.sha256(found.payload).hexdigest()


def _same_kernel(a: artifact.Artifact, b: artifact.Artifact) -> bool:
    """Whether two envelopes carry the same compiled code (other fields may differ)."""
    return (a.executor, a.executor_version, a.payload) == (
        b.executor,
        b.executor_version,
        b.payload,
    )
