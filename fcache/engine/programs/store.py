"""Stored programs in fcache's own tiers: AOTAutograd's cache entries for fcache's graphs
kept in the session's TieredCache (local LMDB, fcache-server), beside the regions.

Why. AOTAutogradCache keeps its entries in Inductor's cache directory, which a fresh
container, another node or a cleaned /tmp does not have; the regions would still be found
in fcache's tiers, but AOTAutograd would trace and fcache would cut every graph again.
With this, whatever finds the regions finds the programs too.

How. AOTAutogradCache asks its remote cache after its local directory misses, and writes
to it after a compile, when `enable_remote_autograd_cache` is on. For the length of a
Backend call (fcache.engine.backend) that switch is on and AOTAutogradCache's remote cache
is the session's `programs`: torch's RemoteCache (its JSON serde) over `ProgramBackend`,
which stores torch's value as a torch entry (fcache.cache.torch_entries) under the fcache
key of torch's key. Torch's key already names fcache (cache_key_tag, the capture version),
so these entries never answer plain torch.compile's look-ups.

Trust. An entry is torch's pickle of fcache's ProgramGraph (graph text and plan; never a
kernel), read through TieredCache: checksummed, signed and verified with a signing key,
refused (a miss) otherwise; and handed to torch only for the key it was stored under.

Pickled for real. torch 2.11's AOTAutogradCache pickles an entry while the compile's fake
mode is still active; an entry holding a CUDA tensor (Gemma2's and Falcon's, one of a few
bytes) then fails (pickling copies it to the CPU, which the fake mode refuses) and neither
the program nor the whole function is stored: a warm process traced again. torch 2.13
pickles its entries under `_disable_current_modes`; `pickled_outside_modes` gives
AOTAutogradCache and the precompile modules (aot_compile) a `pickle` whose `dumps` does
the same, for the length of fcache's Backend call and of a whole function's compile.

Failure contract: never raises into torch; a failed read is a miss, a failed write is
counted by the tiers and dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any
from unittest import mock

from fcache.cache.torch_entries import artifact, fcache_key, value_of
from fcache.errors import CorruptArtifact

if TYPE_CHECKING:
    from fcache.cache.tiered import TieredCache
    from fcache.engine.compile.session import Session

log = logging.getLogger(__name__)


class ProgramBackend:
    """Torch's RemoteCacheBackend interface (get/put of bytes by torch's key) over a
    TieredCache. Thread-safe as the TieredCache is."""

    def __init__(
        self, cache: TieredCache, torch_version: str, on_miss: Callable[[], None] | None = None
    ) -> None:
        self._cache = cache
        self._torch_version = torch_version
        self._on_miss = on_miss

    def get(self, torch_key: str) -> bytes | None:
        try:
            found = self._cache.get(fcache_key(torch_key))
            if found is None:
                if self._on_miss is not None:
                    self._on_miss()
                return None
            return value_of(torch_key, found[0])
        except CorruptArtifact as exc:
            log.warning("fcache: ignoring stored program %s: %s", fcache_key(torch_key), exc)
            return None
        except Exception:  # never into torch: a miss, AOTAutograd traces
            log.warning("fcache: stored program not read", exc_info=True)
            return None

    def put(self, torch_key: str, value: bytes) -> None:
        try:
            # Ranks compiling one model at once each store the same program (its bytes
            # differ: torch records compile times); the first write wins, and a rank that
            # finds it stored writes nothing, so servers see few conflicts.
            if self._cache.get(fcache_key(torch_key)) is not None:
                return
            self._cache.put(fcache_key(torch_key), artifact(torch_key, value, self._torch_version))
        except Exception:
            log.warning("fcache: stored program not written", exc_info=True)

    # torch's RemoteCacheBackend spells the same methods with an underscore.
    _get = get
    _put = put


def remote_cache(cache: TieredCache, on_miss: Callable[[], None] | None = None) -> Any:
    """`cache` as torch's RemoteCache of programs; `on_miss` runs when a program is not
    found (AOTAutograd traces next, and the graph's regions are likely to compile)."""
    import torch
    from torch._inductor.remote_cache import RemoteCache, RemoteCacheJsonSerde

    backend = ProgramBackend(cache, str(torch.__version__), on_miss)
    return RemoteCache(backend, RemoteCacheJsonSerde())  # type: ignore[arg-type]


def routed(
    session: Session, on_miss: Callable[[], None] | None = None
) -> AbstractContextManager[Any]:
    """AOTAutogradCache's remote cache is the session's program store within this block
    (and its entries are pickled outside the fake mode: module doc)."""
    try:
        from torch._functorch._aot_autograd import autograd_cache
    except ImportError:  # a torch without it: the local directory only
        return nullcontext()
    found = autograd_cache.AOTAutogradCache
    if not hasattr(found, "get_remote_cache"):
        return nullcontext()
    cache = remote_cache(session.cache, on_miss)
    stack = ExitStack()
    stack.enter_context(mock.patch.object(found, "get_remote_cache", staticmethod(lambda: cache)))
    stack.enter_context(pickled_outside_modes())
    return stack


# Modules of torch that pickle compiled artifacts with the `pickle` module (module doc).
_PICKLING = (
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._dynamo.aot_compile",
    "torch._dynamo.aot_compile_types",
    "torch._dynamo.package",
)


def pickled_outside_modes() -> AbstractContextManager[Any]:
    """Within this block, torch's artifact pickling runs outside its dispatch modes. fcache
    itself pickles nothing: it wraps the `pickle` module those torch modules use."""
    import importlib

    stack = ExitStack()
    for name in _PICKLING:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        found = getattr(module, "pickle", None)
        if getattr(found, "__name__", None) == "pickle" and hasattr(found, "dumps"):
            stack.enter_context(mock.patch.object(module, "pickle", OutsideModes(found)))
    return stack


class OutsideModes:
    """A `pickle` module whose `dumps` runs outside torch's dispatch modes (a fake mode):
    a real tensor pickles as itself instead of failing as a fake mode's input."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def dumps(self, obj: Any, *args: Any, **kwargs: Any) -> bytes:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return self._module.dumps(obj, *args, **kwargs)  # type: ignore[no-any-return]
