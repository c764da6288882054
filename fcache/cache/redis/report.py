"""What `fcache stats` shows of the Redis behind FCACHE_REDIS: its memory, bound, eviction
policy and evictions, or why it could not be asked. Never raises for an unreachable Redis."""

from __future__ import annotations

from typing import Any

from fcache.cache.redis.store import RedisStore
from fcache.config import Settings
from fcache.errors import StoreUnavailable
from fcache.stats import CacheStats


def describe(settings: Settings) -> dict[str, Any]:
    """RedisStore.server_info of settings.redis, or {"address", "error"}."""
    store = RedisStore.connect(settings, CacheStats())
    try:
        return store.server_info()
    except StoreUnavailable as exc:
        return {"address": store.address, "error": str(exc)}
    finally:
        store.close()


def line(info: dict[str, Any]) -> str:
    """`describe`'s answer as one line of `fcache stats`."""
    if "error" in info:
        return f"redis      {info['address']}: not reachable ({info['error']})"
    bound = _mib(info["maxmemory"]) if info["maxmemory"] else "no maxmemory"
    return (
        f"redis      {info['address']}: {_mib(info['used_memory'])} used of {bound}, "
        f"maxmemory-policy {info['maxmemory_policy']}, {info['evicted_keys']} keys evicted"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
