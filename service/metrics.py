"""Prometheus metrics of one fcache-server (prometheus-client), served over HTTP at /metrics.

    fcache-server --metrics-listen 127.0.0.1:9470 ...   # then: curl 127.0.0.1:9470/metrics

Per call, under grpc-prometheus's names and labels (so its dashboards and alerts apply):

    grpc_server_started_total{grpc_type,grpc_service,grpc_method}
    grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}
    grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}   histogram (a Lease
                                         call lasts as long as the wait or the hold)

The server's own counters (the Stats RPC's, what `fcache stats --server` shows), read at
scrape time, every one of them (SERVER_COUNTERS), as `fcache_server_<name>_total` with
the unit last where there is one: hits, misses, puts, read_bytes, written_bytes,
evictions, corrupt, rejected, errors (internal errors, failures of the store or of the
upstream), lease_grants, lease_waits, compile_saved_seconds, unverified, conflicts,
duplicates, incompatible, stale_readers, overloaded, reported. Gauges: store_entries (re-counted at
most every SIZE_TTL_S), store_bytes, store_max_bytes, and active_leases and
waiting_callers (as of the last call's start or end). With --redis, the Redis tier's own
counters as `fcache_server_redis_<name>_total` (REDIS_COUNTERS): read-through hits and
misses, write-backs, bytes, failures to reach it, entries refused from it, entries found
evicted, cluster leases taken and waited for.

plus prometheus-client's process_* metrics (memory, CPU, file descriptors). Metrics live in
a registry of their own, never the library's global one, so two servers in one process
(tests) do not collide.

Threads: the HTTP server answers on a thread of its own. It reads CacheStats (locked) and
the store (LMDB readers never block); the lease table is not thread-safe, so its gauges are
set by the interceptor, on the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import prometheus_client
from grpc import aio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fcache.cache.lmdb import LmdbStore
from fcache.errors import ConfigError
from fcache.stats import CacheStats, Counters
from service.leases import LeaseTable

PREFIX = "fcache_server"
# Seconds: a Get is milliseconds, a Lease can wait for a whole compile.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600, 1800)
# Counting entries scans the store's index; scrapes come every few seconds.
SIZE_TTL_S = 30.0
# The server's CacheStats counters: field -> (name, help), exported as
# fcache_server_<name>_total (prometheus-client adds the _total).
SERVER_COUNTERS = {
    "hits": ("hits", "artifacts served, by Get or by a Lease that delivered one"),
    "misses": ("misses", "Gets that found no artifact (a Lease counts no second miss)"),
    "puts": ("puts", "artifacts stored"),
    "bytes_read": ("read_bytes", "artifact bytes served"),
    "bytes_written": ("written_bytes", "artifact bytes stored"),
    "evictions": ("evictions", "entries evicted to stay under max_bytes"),
    "corrupt": ("corrupt", "entries that failed verification when read (dropped)"),
    "rejected": ("rejected", "calls refused: bad uploads, missing or insufficient tokens"),
    "errors": ("errors", "internal errors, and failures of the store or the upstream"),
    "lease_grants": ("lease_grants", "leases granted (the caller compiles the region)"),
    "lease_waits": ("lease_waits", "callers that waited on another caller's lease"),
    "compile_seconds_saved": (
        "compile_saved_seconds",
        "compile seconds that the served artifacts had cost",
    ),
    "unverified": ("unverified", "uploads and entries without a valid signature"),
    "reported": ("reported", "entries dropped because a reader refused them (Report)"),
    "conflicts": ("conflicts", "puts refused: other contents are stored under the key"),
    "duplicates": ("duplicates", "puts of what is stored already"),
    "incompatible": ("incompatible", "entries of a newer envelope format (left in place)"),
    "stale_readers": ("stale_readers", "LMDB reader slots of dead processes freed"),
    "overloaded": ("overloaded", "calls refused at the bound of calls or bytes in flight"),
}
# Counters only a client's compiles move (fcache.stats): never the server's.
CLIENT_COUNTERS = frozenset(
    {"compiles", "compile_seconds", "failures", "invalid", "restrided", "unchecked", "fallbacks"}
)
# grpc-prometheus's grpc_type, by the shape of a handler.
_GRPC_TYPES = {
    "unary_unary": "unary",
    "stream_unary": "client_stream",
    "unary_stream": "server_stream",
    "stream_stream": "bidi_stream",
}
_CALL_LABELS = ("grpc_type", "grpc_service", "grpc_method")
# The Redis tier's counters (--redis): field -> (name, help), exported as
# fcache_server_redis_<name>_total, named as SERVER_COUNTERS are.
REDIS_COUNTERS = {
    "hits": ("hits", "artifacts read through from Redis"),
    "misses": ("misses", "read-throughs that found nothing in Redis"),
    "puts": ("puts", "artifacts written back to Redis"),
    "bytes_read": ("read_bytes", "artifact bytes read from Redis"),
    "bytes_written": ("written_bytes", "artifact bytes written to Redis"),
    "errors": ("errors", "Redis calls that failed (unreachable, timed out, refused) or skipped"),
    "corrupt": ("corrupt", "Redis entries refused: not whole, or not a valid envelope"),
    "unverified": ("unverified", "Redis entries refused: signature missing or wrong"),
    "evictions": ("evictions", "Redis entries found with a chunk evicted (a miss)"),
    "overloaded": ("overloaded", "writes Redis refused as full (maxmemory with noeviction)"),
    "lease_grants": ("lease_grants", "compile leases this node took in Redis"),
    "lease_waits": ("lease_waits", "callers that waited on another node's Redis lease"),
}


class ServerMetrics:
    """The metrics of one server; `interceptor()` feeds the per-call ones, `serve()` starts
    the HTTP endpoint. Not an owner of what it reads: stats, store and leases are the
    server's."""

    def __init__(
        self,
        stats: CacheStats,
        store: LmdbStore,
        leases: LeaseTable,
        redis_stats: CacheStats | None = None,
    ) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.started = prometheus_client.Counter(
            "grpc_server_started",
            "gRPC calls started on the server",
            _CALL_LABELS,
            registry=self.registry,
        )
        self.handled = prometheus_client.Counter(
            "grpc_server_handled",
            "gRPC calls completed on the server, by final status code",
            (*_CALL_LABELS, "grpc_code"),
            registry=self.registry,
        )
        self.latency = prometheus_client.Histogram(
            "grpc_server_handling_seconds",
            "gRPC call duration on the server, until the last message or status",
            _CALL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.active_leases = prometheus_client.Gauge(
            f"{PREFIX}_active_leases",
            "leases held (regions being compiled)",
            registry=self.registry,
        )
        self.waiting_callers = prometheus_client.Gauge(
            f"{PREFIX}_waiting_callers", "callers waiting on a lease", registry=self.registry
        )
        self._leases = leases
        self.registry.register(_StoreCollector(stats, store, redis_stats))
        prometheus_client.ProcessCollector(registry=self.registry)
        self._http: Any = None

    def serve(self, address: str) -> str:
        """Serve /metrics on host:port (port 0: any) from a thread; the address as bound.
        ConfigError if it cannot be bound. The endpoint has no authentication: it shows
        counters, never keys or artifacts; bind it where only the scraper reaches."""
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            self._http, _thread = prometheus_client.start_http_server(
                int(port), host, registry=self.registry
            )
        except OSError as exc:  # busy port, unknown host
            raise ConfigError("metrics_listen", address, f"an address to bind ({exc})") from None
        bound = self._http.server_port
        return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"

    def close(self) -> None:
        """Stop the HTTP endpoint. Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            http.shutdown()
            http.server_close()

    def interceptor(self) -> aio.ServerInterceptor:
        return _Interceptor(self)

    def observe_leases(self) -> None:
        """Copy the lease table's sizes into the gauges; event loop only."""
        self.active_leases.set(self._leases.active_leases)
        self.waiting_callers.set(self._leases.waiting_callers)

    def start(self, call: tuple[str, str, str]) -> None:
        self.started.labels(*call).inc()

    def record(self, call: tuple[str, str, str], code: grpc.StatusCode, seconds: float) -> None:
        self.handled.labels(*call, code.name).inc()
        self.latency.labels(*call).observe(seconds)


class _StoreCollector(Collector):
    """The server's CacheStats and store size, read when Prometheus scrapes."""

    def __init__(self, stats: CacheStats, store: LmdbStore, redis_stats: CacheStats | None) -> None:
        self._stats = stats
        self._store = store
        self._redis_stats = redis_stats
        self._entries: tuple[float, int] | None = None  # (when counted, how many)

    def collect(self) -> Iterator[Metric]:
        total: Counters = self._stats.total()
        for field, (name, documentation) in SERVER_COUNTERS.items():
            family = CounterMetricFamily(f"{PREFIX}_{name}", documentation)
            family.add_metric((), float(getattr(total, field)))
            yield family
        if self._redis_stats is not None:
            redis = self._redis_stats.tier("redis")
            for field, (name, documentation) in REDIS_COUNTERS.items():
                family = CounterMetricFamily(f"{PREFIX}_redis_{name}", documentation)
                family.add_metric((), float(getattr(redis, field)))
                yield family
        yield _gauge("store_entries", "artifacts in the store", self._entry_count())
        yield _gauge("store_bytes", "artifact bytes in the store", self._store.total_bytes())
        yield _gauge("store_max_bytes", "the store's size bound, bytes", self._store.max_bytes)

    def _entry_count(self) -> int:
        now = time.monotonic()
        if self._entries is None or now - self._entries[0] > SIZE_TTL_S:
            self._entries = (now, len(self._store.entries()))
        return self._entries[1]


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=float(value))


class _Interceptor(aio.ServerInterceptor):
    """Counts every call, with its final status code and duration. Outermost, so that calls
    refused by the token check count too. It only observes: the status codes themselves
    are set by the servicer (service/servicer.py) and the token check."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        # "/fcache.v1.Cache/Get" -> ("fcache.v1.Cache", "Get"), as grpc-prometheus labels it.
        service, _, name = details.method.lstrip("/").rpartition("/")

        def call(kind: str) -> tuple[str, str, str]:
            return (_GRPC_TYPES[kind], service, name)

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._answered(call("unary_unary"), handler.unary_unary), *_serde(handler)
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._answered(call("stream_unary"), handler.stream_unary), *_serde(handler)
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._streamed(call("unary_stream"), handler.unary_stream), *_serde(handler)
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streamed(call("stream_stream"), handler.stream_stream), *_serde(handler)
        )

    def _answered(
        self, method: tuple[str, str, str], behavior: Callable[..., Any]
    ) -> Callable[..., Any]:
        async def call(request: Any, context: aio.ServicerContext) -> Any:
            with _Call(self._metrics, method, context) as outcome:
                result = await behavior(request, context)
                outcome.ok()
                return result

        return call

    def _streamed(
        self, method: tuple[str, str, str], behavior: Callable[..., Any]
    ) -> Callable[..., Any]:
        if not inspect.isasyncgenfunction(behavior):
            # A coroutine that writes with context.write (the token check's refusal,
            # grpcio-health-checking's Watch): the same shape as a unary answer.
            return self._answered(method, behavior)

        async def call(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            with _Call(self._metrics, method, context) as outcome:
                async for message in behavior(request, context):
                    yield message
                outcome.ok()

        return call


class _Call:
    """One call's measurement: the code is OK if the behavior returned, the code it
    aborted with, CANCELLED if the caller left (or the server stopped it), UNKNOWN if an
    exception escaped."""

    def __init__(
        self, metrics: ServerMetrics, method: tuple[str, str, str], context: aio.ServicerContext
    ):
        self._metrics = metrics
        self._method = method
        self._context = context
        self._code: grpc.StatusCode | None = None

    def ok(self) -> None:
        code = self._context.code()
        self._code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK

    def __enter__(self) -> _Call:
        self._start = time.perf_counter()
        self._metrics.start(self._method)
        self._metrics.observe_leases()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        code = self._code
        if code is None and kind is not None and issubclass(kind, asyncio.CancelledError):
            code = grpc.StatusCode.CANCELLED
        if code is None:  # an abort (its code is on the context) or an escaped exception
            aborted = self._context.code()
            code = aborted if isinstance(aborted, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
        self._metrics.record(self._method, code, time.perf_counter() - self._start)
        self._metrics.observe_leases()


def _serde(handler: grpc.RpcMethodHandler) -> tuple[Any, Any]:
    return handler.request_deserializer, handler.response_serializer
