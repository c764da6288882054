"""Inductor regions on CUDA without a C++ build: Inductor's Python wrapper plus its Triton
kernels as built cubins, the route `fcache.executors.inductor` takes on CUDA.

Why. An AOTInductor package wraps the region's Triton kernels in C++ that g++ builds:
about 15 s per region on an H100 (6.5 s on an idle H200), most of a cold start. Inductor's
own Python wrapper needs no build: compiling a region is lowering plus Triton's compile of
its kernels, 0.3-0.7 s per region on the H100 (bench/inductor_packaging.py).

What an artifact holds (`payload`): the wrapper's source (generated Python: it allocates
outputs and launches the kernels) and, for each kernel, Inductor's statically launchable
autotuner pruned to the config that won autotuning in the compile worker, with that
config's built cubin. That is what Inductor's own FX graph cache stores for a graph
(TritonBundler's static autotuners and kernel files), taken through Inductor's functions,
without the AOTAutograd and FX-cache layers around it. Loading registers those kernels
with Inductor's in-memory kernel table and imports the wrapper: each
`async_compile.triton(...)` then finds its kernel built, and the static CUDA launcher loads
the cubin. No g++, no ptxas, no `triton.compile`, and no benchmarking at the first call
(the winner is the only config).

The device index. Inductor bakes the compiling device's index into the wrapper
(`_DeviceGuard(0)`, `get_raw_stream(0)`) and into each kernel's metadata, but the key does
not hold it, so that ranks on other GPUs share the region. A process on another index loads
the source retargeted to its own (`retarget`): the kernels' metadata then differs from the
built ones, so Triton compiles them from source once per machine (its own cache keeps them),
and the region runs on the right GPU. Same index (one GPU per process, or
CUDA_VISIBLE_DEVICES per rank): nothing is built.

Trust. The kernels come as a pickle, the wrapper as Python source: both are code, as an
AOTInductor package's library is. They are loaded only after the artifact passed fcache's
checks (checksum, and the signature where a signing key is configured).

The payload: MAGIC, a 4-byte big-endian header length, the header (JSON: format, the
compiling device's index, kernel names, the wrapper source), then the pickled kernels.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fcache.errors import CorruptArtifact

log = logging.getLogger(__name__)

MAGIC = b"fcache-inductor-python\x00"
FORMAT = 1
_LENGTH = struct.Struct(">I")


class Unsupported(Exception):
    """The region has no artifact of this route (the caller uses AOTInductor instead)."""


def is_payload(payload: bytes) -> bool:
    return payload.startswith(MAGIC)


# -- compile (in a compile worker) --------------------------------------------------------


def compile_payload(
    module: torch.fx.GraphModule,
    example: Sequence[torch.Tensor],
    run_inputs: Sequence[torch.Tensor],
    device: torch.device,
) -> bytes:
    """Lower `module` with Inductor's Python wrapper, build its kernels, autotune them once
    on `run_inputs` and package the winners. Unsupported when the result would not load
    without a compiler (constants to bind, kernels that are not statically launchable)."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(module, decomposition_table=select_decomp_table(), tracing_mode="fake")(
        *example
    )
    with (
        # Statically launchable kernels are what Inductor bundles (on by default).
        config.patch({k: True for k in ("use_static_cuda_launcher",) if hasattr(config, k)}),
        # Makes Inductor collect the kernels it builds (TritonBundler) for this one graph.
        torch._functorch.config.patch(bundled_autograd_cache=True),
    ):
        compiled = compile_fx_inner(graph, list(example))
    if getattr(compiled, "constants", None):
        raise Unsupported("the region has constants to bind")
    source = getattr(compiled, "source_code", None)
    bundle = getattr(compiled, "_triton_bundle", None)
    if not isinstance(source, str):
        raise Unsupported("Inductor returned no wrapper source")
    static = list(getattr(bundle, "static_autotuners", None) or [])
    launches = len(re.findall(r"= async_compile\.triton\(", source))
    if len(static) != launches:
        raise Unsupported(f"{launches} Triton kernels, {len(static)} statically launchable")

    # Autotune here, once: keep only the config each kernel's benchmark chose.
    with torch.cuda.device(device), torch.no_grad():
        compiled.current_callable(list(run_inputs))
        torch.cuda.synchronize(device)
    winners = _winners(source)
    untuned = []
    for entry in static:
        won = winners.get(entry.kernel_name)
        kept = [r for r in entry.kernel.compile_results if _config_key(r.config) == won]
        if kept:
            entry.kernel.compile_results = kept
            entry.kernel.configs = [r.config for r in kept]
        elif len(entry.kernel.compile_results) > 1:
            untuned.append(entry.kernel_name)
    if untuned:  # correct, but every process that loads it benchmarks these again
        log.warning("fcache: no autotuning winner for %s; they keep every config", untuned)
    index = device.index if device.index is not None else torch.cuda.current_device()
    cubins = _cubins(static, index)
    header = {
        "format": FORMAT,
        "index": index,
        "kernels": sorted(entry.kernel_name for entry in static),
        "source": source,
    }
    return pack(header, pickle.dumps({"autotuners": static, "cubins": cubins}, protocol=4))


def pack(header: dict[str, Any], kernels: bytes) -> bytes:
    """A payload from its header and pickled kernels (`split` is the inverse)."""
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + kernels


def _cubins(static: list[Any], index: int) -> dict[str, bytes]:
    """The built cubin of each kept config, by its path under Triton's cache directory:
    where Inductor's loader (`reload_cubin_path`) looks for it, and where Triton built it in
    this process. A pickled autotuner does not carry it (Inductor drops it, to keep its own
    cache entries small)."""
    from torch._inductor.runtime import triton_heuristics as th

    base = th.triton_cache_dir(index)
    cubins = {}
    for entry in static:
        for result in entry.kernel.compile_results:
            kernel = result.kernel
            rel = os.path.join(th.triton_hash_to_path_key(kernel.hash), f"{kernel.name}.cubin")
            with open(os.path.join(base, rel), "rb") as f:
                cubins[rel] = f.read()
    return cubins


def _winners(source: str) -> dict[str, str]:
    """Each kernel's config that won autotuning (`_config_key`), by kernel name, read from
    the wrapper module Inductor loaded for `source` after it ran: a tuned kernel has one
    launcher left. (The callable Inductor returns may be a wrapper defined elsewhere, so
    the module is found by its path, not through the callable's globals.)"""
    from torch._inductor.codecache import PyCodeCache

    _, path = PyCodeCache.write(source)
    winners = {}
    for module in PyCodeCache.modules:
        if getattr(module, "__file__", None) != path:
            continue
        for name, kernel in vars(module).items():
            if _is_autotuner(kernel) and len(getattr(kernel, "launchers", ())) == 1:
                winners[name] = _config_key(kernel.launchers[0].config)
    return winners


def _is_autotuner(value: object) -> bool:
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    return isinstance(value, CachingAutotuner)


def _config_key(cfg: Any) -> str:
    return repr((sorted(cfg.kwargs.items()), cfg.num_warps, cfg.num_stages))


# -- load ---------------------------------------------------------------------------------


def split(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and the pickled kernels of a payload; CorruptArtifact if malformed."""
    start = len(MAGIC)
    try:
        (length,) = _LENGTH.unpack_from(payload, start)
        header = json.loads(payload[start + _LENGTH.size : start + _LENGTH.size + length])
    except (struct.error, ValueError) as exc:
        raise CorruptArtifact(f"Inductor Python artifact: bad header ({exc})") from None
    if (
        not isinstance(header, dict)
        or header.get("format") != FORMAT
        or not isinstance(header.get("source"), str)
        or not isinstance(header.get("index"), int)
    ):
        raise CorruptArtifact("Inductor Python artifact: unknown header")
    return header, payload[start + _LENGTH.size + length :]


def load_payload(
    payload: bytes, index: int, lock: threading.Lock
) -> Callable[[list[torch.Tensor]], Any]:
    """The region's `call` (boxed: a list in, cleared; a tuple out) on cuda:`index`. `lock`
    (the executor's) makes loads one at a time: Inductor's kernel table and code cache are
    process-wide."""
    from torch._inductor import config
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.triton_bundler import TritonBundler

    header, kernels = split(payload)
    source = lighter(header["source"])
    same_index = index == header["index"]
    if not same_index:
        source = retarget(source, header["index"], index)
    with lock, torch.cuda.device(index):
        try:
            if same_index and kernels:
                built = pickle.loads(kernels)
                _place_cubins(built["cubins"], index)
                # Registered right before the import that consumes them: an entry is used
                # once, and another region may hold a kernel of the same source.
                TritonBundler.load_autotuners(built["autotuners"])
            with config.patch(compile_threads=1):
                module = PyCodeCache.load(source)
        except (pickle.UnpicklingError, SyntaxError, ImportError, AttributeError, KeyError,
                TypeError) as exc:  # fmt: skip
            raise CorruptArtifact(f"Inductor Python artifact does not load: {exc}") from exc
    call = getattr(module, "call", None)
    if not callable(call):
        raise CorruptArtifact("Inductor Python artifact has no call()")
    return call


def _place_cubins(cubins: dict[str, bytes], index: int) -> None:
    """Write each cubin where Inductor's loader reads it, unless it is there: Triton's
    cache directory, named by the kernel's hash (the same bytes for the same name)."""
    from torch._inductor.runtime import triton_heuristics as th

    base = th.triton_cache_dir(index)
    for rel, data in cubins.items():
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or len(parts) != 2:
            raise CorruptArtifact(f"Inductor Python artifact: cubin path {rel!r}")
        path = os.path.join(base, rel)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.{os.getpid()}.tmp"
        with open(temp, "wb") as f:
            f.write(data)
        os.replace(temp, path)


# Where Inductor writes the device index: the wrapper's guard and stream, each kernel's
# DeviceProperties, and `cuda:N` in strings and comments.
_INDEX_FORMS = (
    (r"_DeviceGuard\({i}\)", "_DeviceGuard({j})"),
    (r"set_device\({i}\)", "set_device({j})"),
    (r"get_raw_stream\({i}\)", "get_raw_stream({j})"),
    (r"DeviceProperties\(type='cuda', index={i},", "DeviceProperties(type='cuda', index={j},"),
    (r"device\(type='cuda', index={i}\)", "device(type='cuda', index={j})"),
    (r"\bcuda:{i}\b", "cuda:{j}"),
)


def retarget(source: str, old: int, new: int) -> str:
    """`source` compiled for cuda:`old`, rewritten for cuda:`new`."""
    for pattern, replacement in _INDEX_FORMS:
        source = re.sub(pattern.format(i=old), replacement.format(j=new), source)
    return source


# Two imports of Inductor's wrapper header that pull in its code generators (lowering,
# autotuning, sympy: about a second on a GPU host, the largest part of loading the first
# region of a warm process): `align`, the same function from the module that defines it,
# and `extern_kernels` (Inductor's library calls, such as mm), left out where unused.
_ALIGN = "from torch._inductor.codegen.memory_planning import _align as align\n"
_EXTERN = "from torch._inductor.select_algorithm import extern_kernels\n"


def lighter(source: str) -> str:
    """`source` (a wrapper) with its header's heavy imports replaced where that changes
    nothing it runs."""
    from torch._inductor import utils

    if _ALIGN in source and hasattr(utils, "_align"):
        source = source.replace(_ALIGN, "from torch._inductor.utils import _align as align\n", 1)
    if _EXTERN in source and source.count("extern_kernels") == 1:
        source = source.replace(_EXTERN, "", 1)
    return source
