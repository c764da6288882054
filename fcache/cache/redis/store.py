"""RedisStore: a Redis (or Redis Cluster) as a cache tier, a ByteStore and Leases.

Contract:

- Thread-safe; usable after fork (redis-py's pool opens new connections in a child).
  Connecting is lazy: an unreachable Redis shows on the first call.
- Every call has a deadline (`timeout_s`, the socket timeouts of fcache.cache.redis.connect)
  and at most one quick retry of a dropped connection.
- Every failure raises `fcache.errors.StoreUnavailable` and is counted as `errors` in the
  "redis" tier of the stats. The first of an outage is a warning, and while it lasts one
  more every `warn_every_s` with the count of failed calls (fcache.cache.outage, as the
  fcache-server tier does); its end is one line at INFO. After `breaker_failures` failures
  in a row the store stops calling Redis for a cooldown and raises at once (counted too:
  the CircuitBreaker of the fcache-server tier), so a dead Redis costs each region one
  fast exception.
- A Redis that is full and evicts nothing (maxmemory reached with maxmemory-policy
  noeviction) refuses writes with OOM: counted `overloaded`, one warning saying which
  setting to change, and not an outage (reads go on; the breaker stays closed).
- What `get` returns matches its frame's size and xxh3-128 (fcache.cache.redis.layout);
  a value that is no frame of ours or does not match it is counted `corrupt`, deleted
  (only if still the one read) and missed. An entry with a chunk that Redis evicted is a
  miss (counted `evictions`) and is deleted likewise. The envelope inside is verified by
  the tiered cache (checksum and, with a signing key, signature), as for every tier.
- `put` is atomic for readers (chunks first, then the frame; see layout) and the last
  put wins; the chunks of the generation it replaced are deleted.
- `ttl_s`: every key of an entry expires that long after its put; None keeps entries until
  Redis's maxmemory-policy evicts them (allkeys-lru recommended: docs/redis.md).

Counted here, tier "redis": errors, corrupt, evictions (entries found with a chunk
evicted), overloaded, rejected (artifacts over this store's size limit: never sent, and
never read),
lease_grants, lease_waits. Hits, misses and bytes are the caller's to count (the tiered
cache, or fcache-server's read-through), as for the other tiers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fcache import process
from fcache.cache.outage import WARN_EVERY_S, OutageLog
from fcache.cache.redis import layout, lua
from fcache.cache.redis.connect import open_client
from fcache.cache.redis.leases import RedisLeases
from fcache.cache.remote.breaker import CircuitBreaker
from fcache.config import Settings, redact_url
from fcache.errors import ConfigError, StoreUnavailable
from fcache.protocol.limits import MAX_ARTIFACT_BYTES
from fcache.stats import CacheStats

log = logging.getLogger(__name__)

T = TypeVar("T")
TIER = "redis"
# Commands per pipeline round trip: 8 chunks (64 MiB) stay far below Redis's query buffer
# limit (1 GiB) however large the artifact.
BATCH = 8


class RedisStore(RedisLeases):
    """A Redis, as a cache tier. See the module docstring for the contract."""

    name = TIER

    def __init__(
        self,
        url: str,
        stats: CacheStats,
        *,
        timeout_s: float = 5.0,
        ttl_s: float | None = None,
        lease_ttl_s: float = 30.0,
        breaker: CircuitBreaker | None = None,
        max_artifact_bytes: int = MAX_ARTIFACT_BYTES,
        chunk_bytes: int = layout.CHUNK_BYTES,
        warn_every_s: float = WARN_EVERY_S,
    ) -> None:
        self.url = url
        self.address = redact_url(url)
        self.max_artifact_bytes = min(max_artifact_bytes, MAX_ARTIFACT_BYTES)
        self._stats = stats
        self._ttl_ms = int(ttl_s * 1000) if ttl_s else 0
        self._lease_ttl_ms = max(1, int(lease_ttl_s * 1000))
        self._chunk_bytes = chunk_bytes
        self._breaker = breaker or CircuitBreaker()
        self._outage = OutageLog(log, f"Redis {self.address}", warn_every_s)
        self._client = open_client(url, timeout_s)
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (
                ("swap", lua.SWAP),
                ("delete", lua.DELETE_IF_SAME),
                ("release", lua.RELEASE),
                ("renew", lua.RENEW),
            )
        }
        self._oom_warned = False
        self._init_leases()
        process.watch(self)

    @classmethod
    def connect(cls, settings: Settings, stats: CacheStats) -> RedisStore:
        """The store for settings.redis (its timeouts and ttls); ConfigError without one."""
        if settings.redis is None:
            raise ConfigError("redis", None, "a Redis URL (FCACHE_REDIS)")
        return cls(
            settings.redis,
            stats,
            timeout_s=settings.redis_timeout_s,
            ttl_s=settings.redis_ttl_s,
            lease_ttl_s=settings.redis_lease_ttl_s,
            max_artifact_bytes=settings.max_bytes,
        )

    # -- ByteStore ---------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        entry = layout.entry_key(key)

        def call(client: Any) -> tuple[bytes | None, str | None, layout.Frame | None]:
            value = client.get(entry)
            if value is None:
                return None, None, None
            try:
                frame, inline = layout.parse(value, self.max_artifact_bytes)
            except layout.TooLarge as exc:
                return None, f"too large: {exc}", None
            except layout.BadFrame as exc:
                return None, str(exc), None
            if not frame.chunks:
                try:
                    return layout.check(frame, inline), None, frame
                except layout.BadFrame as exc:
                    return None, str(exc), frame
            names = layout.chunk_keys(key, frame)
            parts: list[bytes | None] = []
            for start in range(0, len(names), BATCH):
                parts.extend(client.mget(names[start : start + BATCH]))
            if any(part is None for part in parts):
                return None, "", frame  # a chunk evicted (or replaced): a miss
            try:
                return layout.check(frame, b"".join(parts)), None, frame  # type: ignore[arg-type]
            except layout.BadFrame as exc:
                return None, str(exc), frame

        data, bad, frame = self._call(f"GET {key}", call)
        if bad is None:
            return data
        if bad.startswith("too large"):
            self._stats.add(TIER, rejected=1)
            log.warning("not reading Redis entry %s: %s", key, bad)
            return None
        if bad:
            self._stats.add(TIER, corrupt=1)
            log.warning("dropping corrupt Redis entry %s: %s", key, bad)
        else:
            self._stats.add(TIER, evictions=1)
            log.debug("Redis entry %s lost a chunk to eviction; a miss", key)
        self._forget(key, frame)
        return None

    def put(self, key: str, data: bytes) -> None:
        """Store data under key (last put wins). Raises StoreUnavailable when Redis cannot
        be reached, is full, or the data is over this store's size limit."""
        if len(data) > self.max_artifact_bytes:
            self._stats.add(TIER, rejected=1)
            raise StoreUnavailable(
                f"Redis {self.address}: PUT {key}: {len(data)} bytes, over the limit "
                f"{self.max_artifact_bytes}"
            )
        frame = layout.frame_for(data, os.urandom(16), self._chunk_bytes)
        ttl = self._ttl_ms or None

        def call(client: Any) -> bytes | None:
            if frame.chunks:
                names = layout.chunk_keys(key, frame)
                parts = layout.split(data, self._chunk_bytes)
                for start in range(0, len(names), BATCH):
                    pipe = client.pipeline(transaction=False)
                    for name, part in zip(
                        names[start : start + BATCH], parts[start : start + BATCH], strict=True
                    ):
                        pipe.set(name, part, px=ttl)
                    pipe.execute()
                value = frame.pack()
            else:
                value = frame.pack() + data
            old = self._scripts["swap"](
                keys=[layout.entry_key(key)], args=[value, self._ttl_ms], client=client
            )
            return old  # type: ignore[no-any-return]

        old = self._call(f"PUT {key} ({len(data)} bytes)", call)
        self._drop_old_chunks(key, old, frame)

    def delete(self, key: str) -> None:
        """Delete key's entry and chunks (a corrupt envelope, say); absent keys are fine."""
        head = self._call(f"GETRANGE {key}", lambda c: c.getrange(layout.entry_key(key), 0, 47))
        if not head:
            return
        try:
            frame: layout.Frame | None = layout.parse_head(head)
        except layout.BadFrame:
            frame = None
        self._forget(key, frame, head)

    def contains(self, key: str) -> bool:
        return not self.find_missing([key])

    def find_missing(self, keys: Iterable[str]) -> list[str]:
        """The keys whose entry is absent, in the given order (chunks are not checked:
        a Get may still miss on an evicted one)."""
        keys = list(keys)

        def call(client: Any) -> list[str]:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(layout.entry_key(key))
            return [k for k, n in zip(keys, pipe.execute(), strict=True) if not n]

        return self._call(f"EXISTS ({len(keys)} keys)", call) if keys else []

    def server_info(self) -> dict[str, object]:
        """What `fcache stats` shows of the Redis itself: memory used and its bound, the
        eviction policy, keys evicted so far; summed over the nodes of a cluster."""
        raw = self._call("INFO", lambda c: c.info())
        nodes = [raw] if "used_memory" in raw else list(raw.values())
        return {
            "address": self.address,
            "redis_version": str(nodes[0].get("redis_version", "")) if nodes else "",
            "nodes": len(nodes),
            "used_memory": sum(int(n.get("used_memory", 0)) for n in nodes),
            "maxmemory": sum(int(n.get("maxmemory", 0)) for n in nodes),
            "maxmemory_policy": str(nodes[0].get("maxmemory_policy", "")) if nodes else "",
            "evicted_keys": sum(int(n.get("evicted_keys", 0)) for n in nodes),
        }

    def close(self) -> None:
        """Close the pooled connections; a later call opens new ones. Held leases are no
        longer renewed: they lapse within their ttl."""
        self._leases_after_fork()
        try:
            self._client.close()
        except Exception as exc:  # closing must not fail the caller's shutdown
            log.debug("closing the Redis client: %s", exc)

    def after_fork_in_child(self) -> None:
        self._leases_after_fork()

    # -- plumbing ----------------------------------------------------------------------

    def _forget(self, key: str, frame: layout.Frame | None, head: bytes | None = None) -> None:
        """Delete the entry (and its chunks) if it still begins with what was read."""
        if frame is None and head is None:
            head = self._call(f"GETRANGE {key}", lambda c: c.getrange(layout.entry_key(key), 0, 47))
        seen = frame.pack() if frame is not None else head
        if not seen:
            return
        names = [layout.entry_key(key), *(layout.chunk_keys(key, frame) if frame else [])]
        try:
            self._call(
                f"DELETE {key}",
                lambda c: self._scripts["delete"](keys=names, args=[seen], client=c),
            )
        except StoreUnavailable as exc:
            log.debug("could not delete %s: %s", key, exc)

    def _drop_old_chunks(self, key: str, old: bytes | None, new: layout.Frame) -> None:
        if not old:
            return
        try:
            frame = layout.parse_head(old)
        except layout.BadFrame:
            return
        if frame.chunks and frame.generation != new.generation:
            names = layout.chunk_keys(key, frame)
            try:
                self._call(f"DEL old chunks of {key}", lambda c: c.delete(*names))
            except StoreUnavailable as exc:  # orphans: LRU (or their ttl) removes them
                log.debug("old chunks of %s not deleted: %s", key, exc)

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run one step under the breaker; map every Redis failure to StoreUnavailable."""
        import redis

        if not self._breaker.allows():
            self._stats.add(TIER, errors=1)  # not asked, so not a miss: the tier failed
            self._outage.failed(None)
            raise StoreUnavailable(f"Redis {self.address}: {what}: skipped (circuit open)")
        try:
            result = fn(self._client)
        except redis.ResponseError as exc:
            # OutOfMemoryError (redis-py >= 4.6; older ones keep Redis's "OOM" prefix).
            if type(exc).__name__ == "OutOfMemoryError" or str(exc).startswith("OOM"):
                raise self._full(what, exc) from None
            raise self._failed(what, f"{type(exc).__name__}: {exc}") from None
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise self._failed(what, f"{type(exc).__name__}: {exc}") from None
        if self._breaker.succeeded():
            self._outage.recovered()
        return result

    def _failed(self, what: str, why: str) -> StoreUnavailable:
        self._stats.add(TIER, errors=1)
        self._breaker.failed()
        self._outage.failed(f"{what}: {why}")
        return StoreUnavailable(f"Redis {self.address}: {what}: {why}")

    def _full(self, what: str, exc: Exception) -> StoreUnavailable:
        self._stats.add(TIER, overloaded=1)
        message = f"Redis {self.address}: {what}: refused: {exc}"
        if not self._oom_warned:
            self._oom_warned = True
            log.warning(
                "%s. Redis is at its maxmemory and evicts nothing: set maxmemory-policy "
                "allkeys-lru (docs/redis.md) so that old entries make room",
                message,
            )
        return StoreUnavailable(message)
