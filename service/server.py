"""Runs one fcache-server: build it from a ServerConfig, bind, serve until told to stop.

Shutdown (SIGTERM or SIGINT): health turns NOT_SERVING; leases end at once (their
callers compile locally rather than wait on a server that is leaving); the gRPC server
refuses new calls and gives in-flight ones `grace_s` to finish; queued write-backs get
the same grace to reach the upstream; then the store closes. A Put is answered only
after its LMDB transaction committed (sync=True), so every acknowledged write survives.

Trust: with `signing_key_file`, the server verifies every upload and every entry it
serves (service.storage); without one (logged as a warning at start) it still replaces an
unsigned entry with a signed upload and drops entries its readers report refused. A TCP
listener needs token files unless `insecure` (checked by service.config); tokens on a
TCP listener without TLS cost a warning at start. Unix sockets are served through
service.peercred: gRPC listens in a private directory, and the public socket admits only
the users the peer-credential check allows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc import aio
from grpc_reflection.v1alpha import reflection

import fcache
from fcache import process
from fcache.cache.lmdb import LmdbStore
from fcache.cache.redis import RedisStore
from fcache.cache.remote import RemoteStore
from fcache.cache.signing import Signer
from fcache.config import Settings
from fcache.errors import ConfigError, StoreUnavailable
from fcache.protocol import wire
from fcache.stats import CacheStats
from service.auth import AuthInterceptor, Tokens
from service.cluster import ClusterLeases
from service.config import ServerConfig
from service.health import SERVICE as SERVICE_HEALTH
from service.health import HealthServicer
from service.leases import LeaseTable
from service.metrics import ServerMetrics
from service.peercred import PeerCheckedSocket, PeerPolicy, group_id
from service.servicer import CacheServicer, Limits
from service.storage import NodeStorage
from service.upstream import Upstream

log = logging.getLogger(__name__)

TIER = "server"
# What server reflection describes: the cache protocol, health, and reflection itself.
REFLECTED = (wire.SERVICE, SERVICE_HEALTH, reflection.SERVICE_NAME)
# LMDB calls and envelope checks; reads run in parallel, writes queue on LMDB's lock.
STORE_THREADS = 16
_SERVER_OPTIONS = (
    # Notice within about 80 s a client that vanished without closing its connection (a
    # lease holder's machine died), so its lease passes on; TCP alone may take hours.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # gRPC sets SO_REUSEPORT by default; a second server on a busy port must fail, not
    # silently share it.
    ("grpc.so_reuseport", 0),
)


async def serve(config: ServerConfig, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set, or SIGTERM/SIGINT when no event is given."""
    stop = stop or _stop_on_signals()
    stats = CacheStats()
    tokens = Tokens.from_files(config.read_token_file, config.write_token_file)
    credentials = _credentials(config)
    signer = None
    if config.signing_key_file is not None:
        signer = Signer.from_file(config.signing_key_file, "--signing-key-file")
    else:
        # Clients verify what they load whatever the server does (their key is on by
        # default), but a server without the key cannot refuse a plant before storing it.
        log.warning(
            "no --signing-key-file: uploads are checked as envelopes only; give the server "
            "the producers' key to refuse unsigned and forged uploads (docs/trust.md)"
        )
    _warn_plaintext_tokens(config)
    store = LmdbStore(config.db, config.max_bytes, stats)
    pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="fcache-store")
    upstream = _upstream(config, pool, stats, store)
    # With a Redis: the node's way to the cluster, with counters of its own ("redis.*").
    redis_stats = CacheStats() if config.redis else None
    cluster = None
    if config.redis is not None and redis_stats is not None:
        redis = _redis(config, redis_stats)
        upstream = Upstream(redis, pool, redis_stats, TIER, store.get, count_traffic=True)
        cluster = ClusterLeases(redis, upstream, pool, redis_stats)
    leases = LeaseTable()
    health = HealthServicer()
    await health.set_serving(True)
    metrics = ServerMetrics(stats, store, leases, redis_stats) if config.metrics_listen else None
    servicer = CacheServicer(
        NodeStorage(store, stats, TIER, pool, upstream, signer),
        leases,
        stats,
        TIER,
        Limits(
            config.max_upload_bytes,
            config.max_lease_s,
            config.max_inflight_bytes,
            max_calls=config.max_concurrent_rpcs,
        ),
        cluster,
        redis_stats,
    )
    interceptors = [AuthInterceptor(tokens, stats, TIER)] if tokens else []
    if metrics is not None:  # outermost: it counts the calls the token check refuses too
        interceptors.insert(0, metrics.interceptor())
    # No gRPC limit on calls: its refusals would be uncounted, and would count lease
    # waiters against their holder's Put. The servicer's CallGate bounds calls instead.
    server = aio.server(interceptors=interceptors, options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((servicer.handler(), health.handler()))
    # Server reflection (grpcurl, grpcui): the services and their message types.
    reflection.enable_server_reflection(REFLECTED, server)
    process.sweep_dead_dirs(tempfile.gettempdir(), _PRIVATE_PREFIX)
    # gRPC's own Unix sockets, 0700, named after this process (swept if it dies unclean).
    private = tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-")
    sockets: list[PeerCheckedSocket] = []
    extra: dict[str, str] = {}
    try:
        bound = [
            _bind(server, address, credentials, _unix(config, private, stats, sockets))
            for address in config.listen
        ]
        for unix_socket in sockets:
            try:
                unix_socket.start()
            except OSError as exc:
                raise ConfigError(
                    "listen",
                    f"unix:{unix_socket.path}",
                    f"a socket path this server can own ({exc})",
                ) from None
        await server.start()
        if upstream is not None:
            upstream.start()
        if cluster is not None:
            asyncio.get_running_loop().run_in_executor(pool, _describe_redis, cluster.store)
        if metrics is not None:
            extra["metrics"] = metrics.serve(config.metrics_listen or "")
        _announce(bound, config.ready_file, extra)
        await stop.wait()
        log.info("stopping: in-flight calls get %.0f s", config.grace_s)
        await health.set_serving(False)
        leases.close()
        for unix_socket in sockets:
            unix_socket.close()  # no new connections; open ones drain with the server
        await server.stop(config.grace_s)
        if upstream is not None:
            await upstream.close(config.grace_s)
        if cluster is not None:
            await cluster.close(config.grace_s)
    finally:
        for unix_socket in sockets:
            unix_socket.close()
            unix_socket.close_connections()
        shutil.rmtree(private, ignore_errors=True)
        if metrics is not None:
            metrics.close()
        pool.shutdown(wait=True)
        store.close()
    log.info("stopped")


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    pair = (config.tls_key.read_bytes(), config.tls_cert.read_bytes())
    return grpc.ssl_server_credentials([pair])


def _upstream(
    config: ServerConfig, pool: ThreadPoolExecutor, stats: CacheStats, store: LmdbStore
) -> Upstream | None:
    if config.upstream is None:
        return None
    settings = Settings(
        server=config.upstream,
        token_file=config.upstream_token_file,
        tls_ca=config.upstream_tls_ca,
    )
    # The client counts its failures under its own tier ("remote"), which Stats includes.
    return Upstream(RemoteStore.connect(settings, stats), pool, stats, TIER, store.get)


def _redis(config: ServerConfig, stats: CacheStats) -> RedisStore:
    """The Redis tier (connected lazily: an unreachable Redis is a counted error per call,
    never a server that does not start). Uploads are bounded by max_upload_bytes, so
    nothing larger is read back either."""
    assert config.redis is not None
    return RedisStore(
        config.redis,
        stats,
        timeout_s=config.redis_timeout_s,
        ttl_s=config.redis_ttl_s,
        lease_ttl_s=config.redis_lease_ttl_s,
        max_artifact_bytes=config.max_upload_bytes,
    )


def _describe_redis(redis: RedisStore) -> None:
    """One line at start on the Redis this server uses, and a warning for a policy that
    fills it up (noeviction: writes refused once maxmemory is reached)."""
    try:
        info = redis.server_info()
    except StoreUnavailable:
        return  # the store has logged it; the tier is tried again at each call
    log.info(
        "Redis %s: version %s, %d node(s), maxmemory-policy %s",
        info["address"],
        info["redis_version"],
        info["nodes"],
        info["maxmemory_policy"],
    )
    if info["maxmemory_policy"] == "noeviction" and info["maxmemory"]:
        log.warning(
            "Redis %s evicts nothing at its maxmemory: fcache's writes will be refused once it "
            "is full; set maxmemory-policy allkeys-lru (docs/redis.md)",
            info["address"],
        )


_PRIVATE_PREFIX = "fcache-server-"


def _warn_plaintext_tokens(config: ServerConfig) -> None:
    tokens = config.read_token_file is not None or config.write_token_file is not None
    tcp = [a for a in config.listen if not a.startswith("unix:")]
    if tokens and tcp and config.tls_cert is None:
        log.warning(
            "tokens are accepted over plaintext TCP on %s: anyone on the path can read them "
            "(set --tls-cert and --tls-key, or listen on a Unix socket)",
            ", ".join(tcp),
        )


class _unix:
    """Binds a Unix address: gRPC on a private socket, the public one peer-checked."""

    def __init__(
        self, config: ServerConfig, private: str, stats: CacheStats, out: list[PeerCheckedSocket]
    ) -> None:
        self._config, self._private, self._stats, self._out = config, private, stats, out

    def __call__(self, server: aio.Server, public: str) -> None:
        backend = os.path.join(self._private, f"grpc-{len(self._out)}.sock")
        server.add_insecure_port(f"unix:{backend}")
        policy = PeerPolicy(owner=os.geteuid(), gid=group_id(self._config.socket_group))
        self._out.append(
            PeerCheckedSocket(
                public,
                backend,
                policy,
                mode=self._config.socket_mode,
                on_refused=lambda pid, uid, gid: self._stats.add(TIER, rejected=1),
            )
        )


def _bind(
    server: aio.Server,
    address: str,
    credentials: grpc.ServerCredentials | None,
    unix: _unix | None = None,
) -> str:
    """Listen on address; the address as bound (port 0 replaced by the real port).

    Unix sockets stay plaintext even with TLS configured: only local processes reach
    them, and the peer-credential check decides which (service.peercred)."""
    if unix is not None and address.startswith("unix:"):
        unix(server, address[len("unix:") :])
        return address
    try:
        if credentials is None or address.startswith("unix:"):
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpcio reports a failed bind this way
        raise ConfigError("listen", address, f"an address this process can bind ({exc})") from None
    if address.startswith("unix:"):
        return address
    return f"{address.rpartition(':')[0]}:{port}"


def _announce(
    addresses: list[str], ready_file: Path | None, extra: dict[str, str] | None = None
) -> None:
    """Say where the server listens: a log line each, and the ready file if asked (`extra`
    adds keys to it: "metrics", the bound metrics address).

    The ready file is written whole (temp file + os.replace), so a reader that sees it
    sees every address and knows the server is serving."""
    for address in addresses:
        log.info("fcache-server %s listening on %s", fcache.__version__, address)
    if extra and "metrics" in extra:
        log.info("metrics on http://%s/metrics", extra["metrics"])
    if ready_file is None:
        return
    payload = json.dumps({"pid": os.getpid(), "addresses": addresses, **(extra or {})})
    ready_file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=ready_file.parent, prefix=f".{ready_file.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(payload)
    os.replace(tmp, ready_file)
