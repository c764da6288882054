"""`share_torch_compile`: fcache-server, or a Redis, as torch.compile's own remote cache.

    import fcache, torch
    fcache.share_torch_compile()     # the server from FCACHE_SERVER (or server="unix:/...")
    fcache.share_torch_compile(redis="redis://cache:6379/0")   # or the cluster's Redis
    model = torch.compile(model)     # plain torch.compile; its caches now reach the server

No fcache.jit needed: Inductor keeps compiling as it always does, and the second process,
rank or node that compiles the same graph finds Inductor's own artifacts on the server.

How. Inductor's remote caches (torch._inductor.remote_cache) take their storage backend
from a class attribute, `backend_override_cls` (read in torch 2.11 and 2.13; it came with
the RemoteCache clean-up of 2024, pytorch#134032); OSS torch otherwise only knows Redis.
This module sets it on RemoteFxGraphCache, RemoteAOTAutogradCache, RemoteAutotuneCache
and RemoteBundledAutotuneCache to a backend
that stores through fcache's RemoteStore: the same server, tokens, TLS, deadlines,
circuit breaker, size bounds and stats as fcache's own regions. With `redis=URL` the
backend stores through fcache's RedisStore instead (fcache.cache.redis: the same Redis the
cluster's fcache processes and node servers use, with its deadlines, breaker and checked
frames), so one Redis serves fcache's regions and torch.compile's own entries.

Switches stay torch's. `share_torch_compile` turns on the remote caches whose switch is
unset (None: TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE, TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE,
TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE not in the environment; the bundled autotune
cache only where Triton is, since Inductor requires a Triton backend for it); one set to 0
stays off, and torch.compiler.config.force_disable_caches still disables everything. The
per-kernel autotune cache (TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE) gets the backend too but
is not turned on: Inductor opens it in its compile-worker processes, which this process's
override does not reach. Its results travel in the bundled autotune cache instead, which
Inductor reads and writes in this process, one entry per graph.

Keys and values (fcache.cache.torch_entries): torch's key becomes an fcache key in a
namespace of its own, torch's value (its JSON bytes: base64 of its pickle) the opaque
payload of fcache's envelope. Puts are signed with the process's signing key
(fcache.cache.signing.signer_for: FCACHE_SIGNING_KEY_FILE, else the cache directory's
own, made on first use), and reads verify the envelope's checksum (the server verifies
it too, on every put and get), its signature (unless FCACHE_VERIFY=0) and that the key
inside is the key asked for; anything else is a counted `corrupt` or `unverified` miss
(an unverified one reported to the server), never bytes handed to torch's unpickler.
fcache never unpickles anything itself; what torch does with its own entry is torch's
(its local cache unpickles the same bytes).

What a hit saves. On CUDA an FX-graph entry carries its Triton kernels
(TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE, on by default): a second process
compiles no Triton kernel. On CPU an entry carries the kernels' C++ source, not the built
libraries: Inductor skips lowering and code generation, but still builds each kernel with
g++ in a process whose local Inductor cache is empty.

Failures: a server that is down, slow or refusing costs what RemoteStore's contract says
(counted errors, one warning, the circuit breaker) and torch sees a miss, or a write that
did not happen; torch.compile never fails because of the server.

Process-wide: one `TorchCacheSharing` per Settings (fcache.process); `stop()` puts
torch's previous backends and switches back. Thread-safe: Inductor calls backends from
its compile threads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fcache import process
from fcache.cache.artifact import decode, encode
from fcache.cache.signing import signer_for
from fcache.cache.torch_entries import artifact, cache_name, fcache_key, value_of
from fcache.config import Settings, redact_url
from fcache.errors import ConfigError, CorruptArtifact, NewerFormat, StoreUnavailable, Unverified
from fcache.stats import CacheStats, Counters

if TYPE_CHECKING:
    from fcache.cache.redis import RedisStore
    from fcache.cache.remote import RemoteStore

log = logging.getLogger(__name__)

SOURCE_PREFIX = "torch:"  # CacheStats sources: "torch:fx-graph-v1", ...
# torch._inductor.remote_cache classes whose backend is replaced.
CACHES = (
    "RemoteFxGraphCache",
    "RemoteAOTAutogradCache",
    "RemoteAutotuneCache",
    "RemoteBundledAutotuneCache",
)
# The switches turned on when unset: (module, attribute).
SWITCHES = (
    ("torch._inductor.config", "fx_graph_remote_cache"),
    ("torch._functorch.config", "enable_remote_autograd_cache"),
    ("torch._inductor.config", "bundled_autotune_remote_cache"),
)


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


class TorchCacheBackend:
    """One Inductor remote cache's backend (what `backend_override_cls()` returns): bytes
    by torch's key, through the sharing's RemoteStore. Never raises: a failure is a miss."""

    def __init__(self, sharing: TorchCacheSharing) -> None:
        self._sharing = sharing

    def get(self, key: str) -> bytes | None:
        return self._sharing.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._sharing.put(key, data)

    # torch's RemoteCacheBackend spells the same methods with an underscore.
    _get = get
    _put = put


class TorchCacheSharing:
    """Inductor's remote caches routed to one fcache-server, or to a Redis when
    `use_redis` (see the module docstring). Thread-safe."""

    def __init__(
        self,
        settings: Settings,
        store: RemoteStore | RedisStore | None = None,
        *,
        use_redis: bool = False,
    ) -> None:
        import torch

        self.settings = settings
        self.stats = CacheStats()
        self._process_key = _process_key(settings, use_redis)
        if store is not None:
            self.store = store
        elif use_redis:
            from fcache.cache.redis import RedisStore

            self.store = RedisStore.connect(settings, self.stats)
        else:
            if settings.server is None:
                raise ConfigError(
                    "server", None, "an fcache-server address (FCACHE_SERVER or server=...)"
                )
            from fcache.cache.remote import RemoteStore

            self.store = RemoteStore.connect(settings, self.stats)
        self._signer = signer_for(settings)
        self._torch_version = str(torch.__version__)
        self._saved: list[tuple[Any, str, Any]] = []  # (owner, attribute, previous value)

    # -- what the backends call -------------------------------------------------------------

    def get(self, torch_key: str) -> bytes | None:
        source = SOURCE_PREFIX + cache_name(torch_key)
        try:
            data = self.store.get(fcache_key(torch_key))
        except StoreUnavailable:  # counted and logged by the store
            self.stats.add(source, misses=1)
            return None
        if data is None:
            self.stats.add(source, misses=1)
            return None
        key = fcache_key(torch_key)
        try:
            found = decode(data)
            if self.settings.verify:
                self._signer.verify(key, found)
            value = value_of(torch_key, found)
        except (CorruptArtifact, NewerFormat) as exc:
            log.warning("fcache: ignoring torch cache entry %s: %s", key, exc)
            self.stats.add(source, misses=1, corrupt=1)
            return None
        except Unverified as exc:
            log.warning("fcache: refusing torch cache entry %s: %s", key, exc)
            self.stats.add(source, misses=1, unverified=1)
            report = getattr(self.store, "report_bad", None)  # the server's; Redis has none
            with contextlib.suppress(StoreUnavailable):  # counted by the store
                if report is not None:
                    report(key, data, str(exc))
            return None
        self.stats.add(source, hits=1, bytes_read=len(value))
        return value

    def put(self, torch_key: str, value: bytes) -> None:
        source = SOURCE_PREFIX + cache_name(torch_key)
        key = fcache_key(torch_key)
        signed = self._signer.sign(key, artifact(torch_key, value, self._torch_version))
        try:
            self.store.put(key, encode(signed))
        except StoreUnavailable:  # counted and logged by the store; torch goes on
            return
        self.stats.add(source, puts=1, bytes_written=len(value))

    # -- installing and removing ------------------------------------------------------------

    def start(self) -> TorchCacheSharing:
        """Install the backends and turn on the unset switches. Idempotent."""
        import importlib

        from torch._inductor import remote_cache

        if self._saved:
            return self
        backend = functools.partial(TorchCacheBackend, self)
        for name in CACHES:
            cls = getattr(remote_cache, name, None)
            if cls is None:  # a torch without this cache
                continue
            self._saved.append((cls, "backend_override_cls", cls.backend_override_cls))
            cls.backend_override_cls = backend
        for module, attribute in SWITCHES:
            if attribute == "bundled_autotune_remote_cache" and not _has_triton():
                continue  # Inductor asserts a Triton backend hash for it (CPU-only torch)
            owner = importlib.import_module(module)
            if getattr(owner, attribute, False) is None:
                self._saved.append((owner, attribute, None))
                setattr(owner, attribute, True)
        log.info("fcache: torch.compile's remote caches use %s", self.store.address)
        return self

    def stop(self) -> None:
        """Put torch's previous backends and switches back. Idempotent."""
        saved, self._saved = self._saved, []
        for owner, attribute, value in reversed(saved):
            setattr(owner, attribute, value)

    def close(self) -> None:
        """Stop sharing and close the server connection (fcache.process.reset calls it)."""
        self.stop()
        self.store.close()
        process.forget(self._process_key, self)

    def counters(self) -> Mapping[str, Counters]:
        """Counters by source: "torch:<cache>" (hits, misses, puts, bytes, corrupt) and
        "remote" or "redis" (the store's errors and refusals)."""
        return self.stats.snapshot()


def share_torch_compile(
    server: str | None = None, *, redis: str | None = None, settings: Settings | None = None
) -> TorchCacheSharing:
    """Route torch.compile's own remote caches (FX graph, AOTAutograd, autotune) to
    fcache-server, or with `redis` to that Redis (a URL as FCACHE_REDIS takes), for the rest
    of this process. `server` defaults to settings.server (FCACHE_SERVER); without either
    argument and without a server, settings.redis (FCACHE_REDIS) is used. Tokens, TLS,
    deadlines and ttls come from `settings` (FCACHE_*). Returns the process's sharing for
    those settings (`.stop()` undoes it, `.counters()` reports). Raises ConfigError when
    neither a server nor a Redis is given, when both are, or when a setting is bad."""
    settings = settings if settings is not None else Settings.from_env()
    if server is not None and redis is not None:
        raise ConfigError("redis", redact_url(redis), "either server= or redis=, not both")
    if server is not None:
        settings = settings.replace(server=server)
    if redis is not None:
        settings = settings.replace(redis=redis)
    use_redis = redis is not None or (settings.server is None and settings.redis is not None)
    if not use_redis and settings.server is None:
        raise ConfigError(
            "server",
            None,
            "an fcache-server address or a Redis URL (FCACHE_SERVER, FCACHE_REDIS, server= "
            "or redis=)",
        )
    sharing = process.shared(
        _process_key(settings, use_redis),
        lambda: TorchCacheSharing(settings, use_redis=use_redis),
    )
    return sharing.start()


def _process_key(settings: Settings, use_redis: bool) -> tuple[object, ...]:
    return ("torch-share", "redis" if use_redis else "server", settings)
