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

Versions are what fcache's region keys use too (fcache.target, through the executors'
toolchains):
the same versions give the same keys on every machine; an edited install of the same
version is not told apart, as it is not for regions. These touch private parts of torch
(`torch._inductor.codecache`); where a torch lacks them, the key is computed as torch
computes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from fcache.target import torch_version, triton_version


@contextlib.contextmanager
def fast_keys() -> Iterator[None]:
    """Within this block AOTAutogradCache computes its keys as the module docstring says."""
    try:
        from torch._functorch._aot_autograd import autograd_cache
        from torch._inductor import codecache
    except ImportError:
        yield
        return
    original = getattr(autograd_cache, "autograd_cache_key", None)
    registered = getattr(codecache, "custom_backend_passes", None)
    needed = ("init_backend_registration", "torch_key", "CacheBase")
    if (
        original is None
        or not isinstance(registered, dict)
        or not all(hasattr(codecache, name) for name in needed)
    ):
        yield
        return

    def key(*args: Any, **kwargs: Any) -> Any:
        passes = {device: p for device, p in registered.items() if p is not None}
        with (
            mock.patch.object(codecache, "init_backend_registration", _no_registration),
            mock.patch.object(codecache, "custom_backend_passes", passes),
            mock.patch.object(codecache, "torch_key", _torch_key),
            mock.patch.object(codecache.CacheBase, "get_system", staticmethod(_system)),
        ):
            return original(*args, **kwargs)

    with mock.patch.object(autograd_cache, "autograd_cache_key", key):
        yield


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
