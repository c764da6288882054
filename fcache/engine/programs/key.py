"""The key of a stored program, without the costs a warm process would pay for it first.

A stored program (fcache.engine.programs.graph) is found by AOTAutogradCache's own key: the Dynamo
graph, its inputs' metadata, grad and autocast state, configs and versions. Computing that
key took most of the time between a warm process's Dynamo trace and its first look-up,
for reasons that have nothing to do with the graph. Within `fast_keys()` three inputs of
the key are computed as fcache computes its region keys instead:

- Inductor's backend registration: the key hashes the custom passes registered for device
  backends, and registering first imports every code generator Inductor has (C++,
  Triton, Halide, Metal, ...): 0.5 s on a CPU machine, 0.6 s on an H100 host, for modules
  a warm process never runs. Inductor's own backends register no custom pass (None); the
  key hashes the passes that are set, without registering, so it is the same in a process
  where Inductor registered its backends (it compiled something) and in one where not.
- torch's version: `torch_key` hashes every torch source file (0.15 s on a CPU machine,
  0.3 s on an H100 host, once per process); here it is torch's version and git revision.
- the system: `get_system` hashes every Triton source file (`triton_key`, 0.4-0.6 s on an
  H100 host); here it is Triton's version, with the GPU's name and the CUDA version as
  torch records them.

- the package: a function stored whole as Dynamo's package is compiled under AOTAutograd
  settings that change how its cache behaves, not what it compiles (`PACKAGE_SETTINGS`),
  and each graph carries a backend id made of a random uuid (`precompile_backend_id`,
  which torch 2.13 hashes). Both are left out of the key, and a graph module's attributes
  are hashed in name order, so the programs a cold process stored while recording a
  package serve a process that does not record one (a package declined after its first
  call: every warm process compiled its programs again).

Versions are what fcache's region keys use too (fcache.target, through the executors'
toolchains):
the same versions give the same keys on every machine; an edited install of the same
version is not told apart, as it is not for regions. These touch private parts of torch
(`torch._inductor.codecache`); where a torch lacks them, the key is computed as torch
computes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from fcache.target import torch_version, triton_version

# AOTAutograd settings the whole-function package compiles under (fcache.engine.whole.
# packaged): they decide whether a cache key may fail (a nonce then, one of its own:
# `_unrepeated`), whether a cache miss raises and whether the cache is used, never the
# compiled graphs.
PACKAGE_SETTINGS = {
    "strict_autograd_cache": True,
    "bypass_autograd_cache_key": True,
    "force_autograd_cache": True,
}


@contextlib.contextmanager
def fast_keys() -> Iterator[None]:
    """Within this block AOTAutogradCache computes its keys as the module docstring says,
    and a graph it cannot key never gets another graph's key (`_unrepeated`)."""
    try:
        from torch._functorch._aot_autograd import autograd_cache
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    original = getattr(autograd_cache, "autograd_cache_key", None)
    if original is None:
        yield
        return
    fast = _fast_key(autograd_cache, codecache, original) or original

    def key(*args: Any, **kwargs: Any) -> Any:
        return _unrepeated(fast(*args, **kwargs))

    with mock.patch.object(autograd_cache, "autograd_cache_key", key):
        yield


def _unrepeated(result: Any) -> Any:
    """`result` (a key and its debug lines), with torch's nonce key replaced by one no
    other graph gets. Where a graph cannot be keyed (Switch Transformers' router reassigns
    its own layer, `.to`, traced as `TensorBase.set_`, which AOTAutogradCache's check
    refuses), the package's settings (`bypass_autograd_cache_key`) make torch key it
    `str(random.random())`; Dynamo restores `random`'s state around every frame it
    compiles, so every such graph of a process got the same key, and the second was
    answered with the first one's program (the same shapes: wrong results, silently)."""
    if not isinstance(result, tuple) or not result or not isinstance(result[0], str):
        return result
    try:
        float(result[0])  # torch's nonce; its real keys start with a letter
    except ValueError:
        return result
    return (f"fcache-nonce-{uuid.uuid4().hex}", *result[1:])


def _fast_key(autograd_cache: Any, codecache: Any, original: Any) -> Any:
    """`original` with the costs the module docstring names taken out, or None where this
    torch lacks the parts it patches."""
    registered = getattr(codecache, "custom_backend_passes", None)
    needed = ("init_backend_registration", "torch_key", "CacheBase")
    if (
        not isinstance(registered, dict)
        or not all(hasattr(codecache, name) for name in needed)
        or not hasattr(autograd_cache, "AOTAutogradCachePickler")
    ):
        return None

    functorch = torch._functorch.config
    unkeyed = [*getattr(functorch, "_save_config_ignore", ()), *PACKAGE_SETTINGS]
    pickler = autograd_cache.AOTAutogradCachePickler
    reducer = _ordered_reducer(pickler)

    def key(mod: Any, example_inputs: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        passes = {device: p for device, p in registered.items() if p is not None}
        if getattr(config, "precompile_backend_id", None) is not None:
            config = dataclasses.replace(config, precompile_backend_id=None)
        with (
            mock.patch.object(functorch, "_save_config_ignore", unkeyed),
            mock.patch.object(codecache, "init_backend_registration", _no_registration),
            mock.patch.object(codecache, "custom_backend_passes", passes),
            mock.patch.object(codecache, "torch_key", _torch_key),
            mock.patch.object(codecache.CacheBase, "get_system", staticmethod(_system)),
            mock.patch.object(pickler, "reducer_override", reducer, create=True),
        ):
            return original(mod, example_inputs, config, *args, **kwargs)

    return key


def _by_name(reduced: Any) -> Any:
    """A graph module's reduction (torch's reducer for cache keys) with its attributes in
    name order: torch pickles them in the order they were set, which differs between a
    graph recompiled after an attribute was added and one recompiled before (the same
    graph keyed two ways)."""
    if isinstance(reduced, dict):
        return dict(sorted(reduced.items()))
    if isinstance(reduced, tuple):
        return tuple(_by_name(part) for part in reduced)
    return reduced


def _ordered_reducer(pickler: type) -> Callable[[Any, Any], Any]:
    """`pickler`'s reducer_override with every graph module reduced as `pickler` reduces
    it (torch 2.13: its own reducer; 2.11: the graph module's `__reduce__`, or the
    dispatch table's entry) and then `_by_name`."""
    original = getattr(pickler, "reducer_override", None)

    def reducer_override(self: Any, obj: Any) -> Any:
        if not isinstance(obj, torch.fx.GraphModule):
            return original(self, obj) if original is not None else NotImplemented
        if original is not None:
            reduced = original(self, obj)
        elif (table := getattr(self, "dispatch_table", {})).get(type(obj)) is not None:
            reduced = table[type(obj)](obj)
        else:
            reduced = obj.__reduce__()
        return _by_name(reduced)

    return reducer_override


def _no_registration() -> None:
    """Stands in for Inductor's backend registration while a key is computed: the custom
    passes that matter are those already registered, by whoever registered them."""


def _torch_key() -> bytes:
    """Stands in for torch's source hash: torch as fcache's region keys name it."""
    return torch_version().encode()


def _system() -> dict[str, Any]:
    """The system in a program key, shaped as torch's `get_system` result: the GPU's
    name and the CUDA or HIP version where a GPU is present, and Triton's version."""
    info: dict[str, Any] = {"device": {"name": None}, "version": {"triton": triton_version()}}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if torch.version.cuda is not None:
            info["device"]["name"] = props.name
            info["version"]["cuda"] = torch.version.cuda
        else:
            info["device"]["name"] = getattr(props, "gcnArchName", props.name)
            info["version"]["hip"] = torch.version.hip
    digest = hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()
    return {**info, "hash": digest}
