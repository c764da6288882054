"""The Redis tier: a Redis or Redis Cluster shared by the nodes of a cluster.

    FCACHE_REDIS=redis://cache.internal:6379/0      fcache processes without a node daemon
    fcache-server --redis redis://...                a node daemon reads through, writes back

Entries are fcache's artifact envelopes, signed and verified as in every tier, laid out
in Redis by `layout` (chunked under Redis's value limit, one hash tag per key so a Redis
Cluster keeps them together); `store` is the tier (RedisStore: a ByteStore with deadlines,
a circuit breaker and counted errors), `leases` single flight across nodes (SET NX PX,
renewed while compiling, released by compare-and-delete), `lua` the scripts that compare
and act atomically, `connect` the redis-py client and its pool, deadlines and retries.

Importing this package loads redis-py; only the tiered cache (when a Redis is configured),
share_torch_compile, the CLI and fcache-server do, so `import fcache` works without it.
"""

from fcache.cache.redis.store import TIER, RedisStore

__all__ = ["TIER", "RedisStore"]
