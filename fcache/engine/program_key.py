"""The key of a stored program, without the costs a warm process would pay for it first.

A stored program (fcache.engine.program) is found by AOTAutogradCache's own key: the Dynamo
graph, its inputs' metadata, grad and autocast state, configs and versions. Computing that
key is most of what stands between a warm process and its first look-up, for two reasons
that have nothing to do with the graph:

- It registers Inductor's device backends first, to hash the custom passes registered
  for them, and registering imports every code generator Inductor has (C++, Triton,
  Halide, Metal, ...): 0.5 s on a CPU machine and 0.6 s on an H100 host, for modules a
  warm process never runs. Inductor's own backends register no custom pass (None). Within
  `fast_keys()` the key hashes the passes that are set, without registering: the same key
  in a process where Inductor registered its backends (it compiled something) and in one
  where it did not.
- It hashes torch's and Triton's sources (`torch_key`, `triton_key`: 0.3 and 0.6 s on an
  H100 host, each once per process). `prefetch()` starts both on a thread when a model is
  wrapped, so they run while Dynamo traces; reading and hashing files release the GIL.

Both touch private parts of torch (`torch._inductor.codecache`); where a torch lacks them,
the key is computed as torch computes it, and nothing is prefetched.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

log = logging.getLogger(__name__)

_prefetched = threading.Event()


@contextlib.contextmanager
def fast_keys() -> Iterator[None]:
    """Within this block AOTAutogradCache computes its keys without registering Inductor's
    backends (see the module docstring)."""
    try:
        from torch._functorch._aot_autograd import autograd_cache
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    original = getattr(autograd_cache, "autograd_cache_key", None)
    registered = getattr(codecache, "custom_backend_passes", None)
    if (
        original is None
        or not isinstance(registered, dict)
        or not hasattr(codecache, "init_backend_registration")
    ):
        yield
        return

    def key(*args: Any, **kwargs: Any) -> Any:
        passes = {device: p for device, p in registered.items() if p is not None}
        with (
            mock.patch.object(codecache, "init_backend_registration", _registered_enough),
            mock.patch.object(codecache, "custom_backend_passes", passes),
        ):
            return original(*args, **kwargs)

    with mock.patch.object(autograd_cache, "autograd_cache_key", key):
        yield


def _registered_enough() -> None:
    """Stands in for Inductor's backend registration while a key is computed: the custom
    passes that matter are those already registered, by whoever registered them."""


def prefetch() -> None:
    """Start hashing torch's and Triton's sources in the background, once per process."""
    if _prefetched.is_set():
        return
    _prefetched.set()
    threading.Thread(target=_hash, daemon=True, name="fcache-source-hashes").start()


def _source_hashes() -> list[Callable[[], Any]]:
    """torch's source hash, and Triton's where Triton is installed: Triton's own cached
    `triton_key`, which torch's `triton_key` (or, on older torch, `get_system`) calls."""
    hashes: list[Callable[[], Any]] = []
    try:
        from torch._inductor import codecache

        hashes.append(codecache.torch_key)
    except (ImportError, AttributeError):
        pass
    try:
        from triton.compiler.compiler import triton_key

        hashes.append(triton_key)
    except (ImportError, AttributeError):  # no Triton (a CPU build), or another layout
        pass
    return hashes


def _hash() -> None:
    # torch and Triton cache each result in the process (where torch's cache is
    # single-flight, a caller that comes while the hash runs waits for it).
    for fn in _source_hashes():
        try:
            fn()
        except Exception:  # the key's own call will raise it where it matters
            log.debug("fcache: prefetching %s failed", getattr(fn, "__name__", fn), exc_info=True)
