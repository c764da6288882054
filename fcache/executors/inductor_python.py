"""Inductor regions without a C++ build at load: Inductor's Python wrapper plus its built
kernels (Triton cubins on CUDA, shared objects on CPU), the route `fcache.executors.inductor`
takes by default on both.

Why. An AOTInductor package wraps the region's kernels in a C++ runner that g++ builds:
about 15 s per region on an H100 (6.5 s on an idle H200), and 6-10 s per region on a
2-core CPU host, of which the kernel itself is under a second (measured with a g++ shim:
the runner's wrapper.cpp takes 6.4-7.5 s at -O1, the kernel 0.7 s, the link 0.45 s).
Inductor's own Python wrapper needs no runner: compiling a region is lowering plus building
its kernels, 0.3-0.7 s per region on the H100 and about 1.6 s on the CPU host
(bench/inductor_packaging.py).

What an artifact holds (`payload`): the wrapper's source (generated Python: it allocates
outputs and calls the kernels) and the built kernels. On CUDA, for each kernel, Inductor's
statically launchable autotuner pruned to the config that won autotuning in the compile
worker, with that config's built cubin: what Inductor's own FX graph cache stores for a
graph (TritonBundler's static autotuners and kernel files), taken through Inductor's
functions, without the AOTAutograd and FX-cache layers around it. Loading registers those
kernels with Inductor's in-memory kernel table and imports the wrapper: each
`async_compile.triton(...)` then finds its kernel built, and the static CUDA launcher loads
the cubin. No g++, no ptxas, no `triton.compile`, and no benchmarking at the first call
(the winner is the only config). On CPU, each C++ kernel's shared object (Inductor's
Python binding of it, built by g++ in the compile worker), by the digest of its source:
loading imports the wrapper with `async_compile.cpp_pybinding` answered from those, so no
compiler runs, whatever paths this machine's Inductor would have built them under.

The device index. Inductor bakes the compiling device's index into the wrapper
(`_DeviceGuard(0)`, `get_raw_stream(0)`) and into each kernel's metadata, but the key does
not hold it, so that ranks on other GPUs share the region. A process on another index loads
the source retargeted to its own (`inductor_source.retarget`) and the built kernels moved
there too (`inductor_kernels.moved`): a cubin belongs to the GPU model, which the key
holds, not to the index. So no index builds the kernels again (before, every kernel of a
region another rank compiled was built again from source: 42 to 62 Triton compiles in a
warm rank of a 16-layer Llama under FSDP2 or DDP on 2 H200s); where a kernel is not in the
form `moved` knows, that wrapper's kernels are built from source, as before.

Trust. The kernels come as a pickle (CUDA) or shared objects (CPU), the wrapper as Python
source: all code, as an AOTInductor package's library is. They are loaded only after the
artifact passed fcache's checks (checksum, and the signature where a signing key is
configured).

The payload: MAGIC, a 4-byte big-endian header length, the header (JSON: format, device
type, the compiling device's index, kernel names, the wrapper source; on CPU each kernel's
source digest and size), then the kernels (CUDA: pickled; CPU: the shared objects, one after
another, in the header's order).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import pickle
import re
import shutil
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from fcache import process
from fcache.errors import CorruptArtifact
from fcache.executors import inductor_kernels
from fcache.executors.inductor_source import lighter, retarget
from fcache.executors.inductor_unchecked import unchecked_call

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
    """Lower `module` with Inductor's Python wrapper, build its kernels (on CUDA: autotune
    them once on `run_inputs`) and package them. Unsupported when the result would not load
    without a compiler (constants to bind, kernels that are not statically launchable, on
    CPU kernels of another kind than C++ bindings)."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(module, decomposition_table=select_decomp_table(), tracing_mode="fake")(
        *example
    )
    if device.type == "cpu":
        return _cpu_payload(graph, example)
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
    cubins = inductor_kernels.cubins(static, index)
    header = {
        "format": FORMAT,
        "device": "cuda",
        "index": index,
        "kernels": sorted(entry.kernel_name for entry in static),
        "source": source,
    }
    return pack(header, pickle.dumps({"autotuners": static, "cubins": cubins}, protocol=4))


def _cpu_payload(graph: torch.fx.GraphModule, example: Sequence[torch.Tensor]) -> bytes:
    """The CPU artifact: the wrapper and the shared object of each of its C++ kernels."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner

    built: list[tuple[str, Any]] = []  # (kernel source digest, its loaded binding), in order

    def recording(inductors: Binding, self: Any, argtypes: list[str], source_code: str) -> Any:
        kernel = inductors(self, argtypes, source_code)
        built.append((_digest(source_code), kernel))
        return kernel

    # One thread builds, here: every kernel's binding is then loaded in this process, where
    # its shared object can be read (with compile threads Inductor builds them in its pool).
    with config.patch(compile_threads=1), _answering(recording):
        compiled = compile_fx_inner(graph, list(example))
    if getattr(compiled, "constants", None):
        raise Unsupported("the region has constants to bind")
    source = getattr(compiled, "source_code", None)
    if not isinstance(source, str):
        raise Unsupported("Inductor returned no wrapper source")
    calls = re.findall(r"\basync_compile\.(\w+)\(", source)
    if other := set(calls) - {"cpp_pybinding", "wait"}:
        raise Unsupported(f"kernels of other kinds than C++ bindings: {sorted(other)}")
    if len(built) != calls.count("cpp_pybinding"):
        # The wrapper was loaded in this process before, so its kernels were not seen.
        raise Unsupported("the wrapper's kernels were built before this compile")
    kernels = dict(built)  # a kernel source may repeat: one shared object for it
    digests = list(kernels)
    objects = []
    for kernel in kernels.values():
        with open(kernel.__self__.__file__, "rb") as f:  # the binding's extension module
            objects.append(f.read())
    header = {
        "format": FORMAT,
        "device": "cpu",
        "index": -1,
        "kernels": [[digest, len(data)] for digest, data in zip(digests, objects, strict=True)],
        "source": source,
    }
    return pack(header, b"".join(objects))


def _digest(kernel_source: str) -> str:
    return hashlib.sha256(kernel_source.encode()).hexdigest()


# Inductor's AsyncCompile.cpp_pybinding(self, argtypes, source_code) -> the kernel's function.
Binding = Callable[[Any, list[str], str], Any]


@contextlib.contextmanager
def _answering(binding: Callable[..., Any]) -> Iterator[None]:
    """Inductor's `AsyncCompile.cpp_pybinding` is answered by `binding(inductors, self,
    argtypes, source_code)` (`inductors`: Inductor's own) for the calls this thread makes
    during the block; other threads (a torch.compile elsewhere in the process) and other
    times get Inductor's own. Nests, and needs no lock: the answer is per thread."""
    local = process.shared("inductor_python.cpp_pybinding", _install_answers)
    with process.set_in_thread(local, "answer", binding):
        yield


def _install_answers() -> threading.local:
    """Route `AsyncCompile.cpp_pybinding` through a per-thread answer (once per process)."""
    from torch._inductor.async_compile import AsyncCompile

    local = threading.local()
    original = AsyncCompile.cpp_pybinding

    def cpp_pybinding(self: Any, argtypes: list[str], source_code: str) -> Any:
        answer = getattr(local, "answer", None)
        if answer is None:
            return original(self, argtypes, source_code)
        return answer(original, self, argtypes, source_code)

    AsyncCompile.cpp_pybinding = cpp_pybinding  # type: ignore[method-assign]
    return local


def pack(header: dict[str, Any], kernels: bytes) -> bytes:
    """A payload from its header and pickled kernels (`split` is the inverse)."""
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + kernels


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
    """The header and the kernels of a payload; CorruptArtifact if malformed."""
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
        or header.setdefault("device", "cuda") not in ("cpu", "cuda")
    ):
        raise CorruptArtifact("Inductor Python artifact: unknown header")
    return header, payload[start + _LENGTH.size + length :]


def load_payload(
    payload: bytes, device_type: str, index: int, lock: threading.Lock
) -> Callable[[list[torch.Tensor]], Any]:
    """The region's `call` (boxed: a list in, cleared; a tuple out) on the CPU or on
    cuda:`index`; CorruptArtifact if the payload was built for another device type. `lock`
    (the executor's) makes loads one at a time: Inductor's kernel table and code cache are
    process-wide."""
    header, kernels = split(payload)
    if header["device"] != device_type:
        raise CorruptArtifact(
            f"an Inductor Python artifact for {header['device']}, not {device_type}"
        )
    if device_type == "cpu":
        return _load_cpu(header, kernels, lock)
    return _load_cuda(header, kernels, index, lock)


def _load_cuda(
    header: dict[str, Any], kernels: bytes, index: int, lock: threading.Lock
) -> Callable[[list[torch.Tensor]], Any]:
    from torch._inductor import config
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.triton_bundler import TritonBundler

    source = lighter(header["source"])
    same_index = index == header["index"]
    if not same_index:
        source = retarget(source, header["index"], index)
    with lock, torch.cuda.device(index):
        try:
            if kernels:
                built = pickle.loads(kernels)
                autotuners = built["autotuners"]
                if not same_index:
                    autotuners = inductor_kernels.moved(autotuners, source, index)
                inductor_kernels.place_cubins(built["cubins"], index)
                for entry in autotuners:
                    inductor_kernels.settle(entry.kernel)
                # Registered right before the import that consumes them: an entry is used
                # once, and another region may hold a kernel of the same source.
                TritonBundler.load_autotuners(autotuners)
            with config.patch(compile_threads=1):
                module = PyCodeCache.load(source)
            return _call_of(module, source)
        except (pickle.UnpicklingError, SyntaxError, ImportError, AttributeError, KeyError,
                TypeError) as exc:  # fmt: skip
            raise CorruptArtifact(f"Inductor Python artifact does not load: {exc}") from exc


def _call_of(module: Any, source: str) -> Callable[[list[torch.Tensor]], Any]:
    """The loaded wrapper's `call` as a function of ours, with the variant that skips its
    size and stride asserts as `.unchecked` (None if it has none; see
    fcache.executors.base.unchecked)."""
    call = getattr(module, "call", None)
    if not callable(call):
        raise CorruptArtifact("Inductor Python artifact has no call()")

    def region(args: list[torch.Tensor]) -> Any:
        return call(args)

    region.unchecked = unchecked_call(module, source)  # type: ignore[attr-defined]
    return region


def _load_cpu(
    header: dict[str, Any], blob: bytes, lock: threading.Lock
) -> Callable[[list[torch.Tensor]], Any]:
    """Import a CPU wrapper with each `async_compile.cpp_pybinding(...)` answered from the
    artifact's shared objects: nothing is built, and a kernel the artifact lacks is a
    CorruptArtifact, never a compile."""
    from torch._inductor.codecache import PyCodeCache

    objects: dict[str, bytes] = {}
    offset = 0
    try:
        for digest, size in header["kernels"]:
            objects[str(digest)] = blob[offset : offset + int(size)]
            offset += int(size)
    except (TypeError, ValueError) as exc:
        raise CorruptArtifact(f"Inductor Python artifact: bad kernel table ({exc})") from None
    if offset != len(blob):
        raise CorruptArtifact("Inductor Python artifact: kernels do not match their table")

    def binding(inductors: Binding, self: Any, argtypes: list[str], source_code: str) -> Any:
        digest = _digest(source_code)
        if digest not in objects:
            raise CorruptArtifact("Inductor Python artifact lacks a kernel its wrapper calls")
        return _import_binding(digest, objects[digest])

    source = lighter(header["source"])
    with lock, _answering(binding):
        try:
            module = PyCodeCache.load(source)
            return _call_of(module, source)
        except (SyntaxError, ImportError, AttributeError, KeyError, TypeError) as exc:
            raise CorruptArtifact(f"Inductor Python artifact does not load: {exc}") from exc


def _import_binding(digest: str, data: bytes) -> Any:
    """The `kernel` function of a kernel's shared object (a Python extension module that
    Inductor built), imported from a private folder under Inductor's cache directory (where
    Inductor's own libraries load from, so a noexec temp dir does not matter) and
    unlinked once loaded."""
    from torch._inductor.codecache import cache_dir

    name = f"fcache_{digest[:40]}.kernel"  # `.kernel`: the extension's PyInit_kernel
    if (module := sys.modules.get(name)) is None:
        # Inductor sets this before loading a binding: the built code reads a tensor's data
        # pointer through it.
        os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(
            torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr  # type: ignore[attr-defined]
        )
        os.makedirs(cache_dir(), exist_ok=True)
        folder = tempfile.mkdtemp(prefix="fcache-kernel-", dir=cache_dir())
        try:
            path = os.path.join(folder, "kernel.so")
            with open(path, "wb") as f:
                f.write(data)
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise CorruptArtifact("Inductor Python artifact: a kernel is not a module")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return module.kernel
