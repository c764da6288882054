"""The fcache-server tier: RemoteStore, a ByteStore and Leases over gRPC.

Its contract (deadlines, the circuit breaker, counted failures, verified transfers,
read-only tokens) is RemoteStore's, in `store`. The wire itself (method paths, chunking,
limits, stubs) is fcache.protocol's, shared with the server; this package is the client
side only. Importing it loads gRPC and the stubs: only the tiered cache (lazily, when a
server is configured), the CLI and fcache-server do.
"""

from fcache.cache.remote.breaker import CircuitBreaker
from fcache.cache.remote.store import TIER, RemoteStore, fetch_server_stats

__all__ = ["TIER", "CircuitBreaker", "RemoteStore", "fetch_server_stats"]
