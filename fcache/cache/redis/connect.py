"""The redis-py client of a Redis URL: its connection pool, deadlines and retry policy.

One client per RedisStore, shared by the store's threads (redis-py's clients are
thread-safe: each command borrows a pooled connection). Its pool notices a fork (a pid
check on every borrow) and opens new connections in the child, never the parent's.

Policy, and why:
- `socket_timeout` and `socket_connect_timeout` are the tier's deadline: a Redis that
  hangs (stopped, swapping, a long command) costs one deadline per call, then the store's
  circuit breaker stops calling it.
- One retry, after 50-200 ms, on a connection error only: a pooled connection that Redis
  closed (a restart, an idle timeout) is replaced at once instead of failing the call. A
  timeout is not retried: that would double the deadline.
- Idle connections are checked with PING before reuse after 30 s, so a Redis restarted
  meanwhile shows as a fresh connection rather than a failed command.
"""

from __future__ import annotations

from typing import Any

from fcache.config import redact_url
from fcache.errors import ConfigError

CLIENT_NAME = "fcache"
HEALTH_CHECK_S = 30


def open_client(url: str, timeout_s: float) -> Any:
    """A redis.Redis (or redis.cluster.RedisCluster for redis+cluster:// URLs) for `url`,
    which fcache.config.parse_redis_url accepted. Connects lazily: nothing is contacted
    here, so an unreachable Redis shows on the first call. redis-py is imported here: a
    process or fcache-server that uses no Redis never needs it."""
    try:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry
    except ImportError as exc:
        raise ConfigError(
            "redis", redact_url(url), "a Redis URL with redis-py installed (pip install redis)"
        ) from exc
    options: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(
            ExponentialBackoff(cap=0.2, base=0.05), 1, supported_errors=(redis.ConnectionError,)
        ),
        "retry_on_timeout": False,
        "health_check_interval": HEALTH_CHECK_S,
        "client_name": CLIENT_NAME,
    }
    scheme, sep, rest = url.partition("://")
    if scheme.endswith("+cluster"):
        from redis.cluster import RedisCluster

        options.pop("retry_on_timeout")
        base = scheme.removesuffix("+cluster")
        return RedisCluster.from_url(f"{base}{sep}{rest}", **options)
    return redis.Redis.from_url(url, **options)
