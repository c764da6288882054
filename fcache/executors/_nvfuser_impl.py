"""nvFuser compile and load: one fusion per region and device, built on a private thread.

Imports `nvfuser_direct`; only the guard (fcache.executors.nvfuser) imports this module,
and only when a region is compiled or loaded for a GPU.

A *fusion* here is a FusionDefinition and its FusionExecutorCache, built from a
canonical region and compiled by running it once on uninitialized tensors with the
region's exact sizes, strides and dtypes (nvFuser compiles on the first execute per
input signature: segmentation, scheduling, lowering, NVRTC). The same steps serve a
cold `compile` and a warm `load`; on a load, the artifact's kernels are first written
into the process's kernel database, so NVRTC is skipped. Kernel names repeat across
processes because every fusion's executor cache has fusion id 0 and is compiled for one
input signature, in the same way each time.

In-process sharing: fusions live in a process-wide table keyed by (region, device
index), so isomorphic regions, from any model or Session, share one definition and one
executor cache; `compile` of a region already built returns its payload, `load` of its
artifact returns a runner on the same fusion.

Threading: every build, harvest and restore runs on one worker thread. That serializes
use of nvFuser's process-wide kernel database and of its global option guards, and keeps
the calling thread's state (AOTAutograd's dispatch modes, its current device) out of
the warm-up. Runners execute on the caller's thread.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import nvfuser_direct as nvf
import torch
import xxhash

from fcache.errors import CompileError, CorruptArtifact
from fcache.executors._nvfuser_kernel_db import KernelDb
from fcache.executors._nvfuser_payload import Payload, decode, encode
from fcache.executors._nvfuser_translate import DTYPE_NAMES, translate
from fcache.executors.nvfuser import STATS
from fcache.frontend.canonicalize import CanonicalRegion, parse

log = logging.getLogger(__name__)

_WORKER = ThreadPoolExecutor(1, thread_name_prefix="fcache-nvfuser")
_FUSIONS: dict[tuple[str, int], Fusion] = {}  # touched on the worker only
_KERNEL_DB: list[KernelDb | None] = []  # [] until the worker first tries to open it


@functools.cache
def toolchain() -> Mapping[str, str]:
    """What besides the region changes nvFuser's kernels (the key's toolchain part)."""
    options = {v: os.environ.get(v, "") for v in ("NVFUSER_ENABLE", "NVFUSER_DISABLE")}
    return {
        "nvfuser": str(nvf.version()),
        "cuda": str(torch.version.cuda),
        "torch": torch.__version__,
        "options": repr(sorted(options.items())),
    }


def _dtype(dtype: torch.dtype) -> Any:
    return getattr(nvf.DataType, DTYPE_NAMES[dtype])


@dataclass(eq=False)
class Fusion:
    """A built, compiled fusion and what a runner needs. Owned by the process table."""

    region: CanonicalRegion
    device: int
    fd: Any
    payload: bytes = b""
    _eager: Callable[..., Any] | None = field(default=None, repr=False)
    _checked: bool = False

    def runner(self) -> Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]:
        execute = self.fd.fec.execute

        def run(inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
            if not self._checked:
                self._first_call(inputs)
            try:
                return execute(inputs)
            except Exception as exc:  # nvFuser's errors are not all RuntimeErrors
                return self._fallback(inputs, exc)

        return run

    def _first_call(self, inputs: list[torch.Tensor]) -> None:
        self._checked = True
        try:
            if not self.fd.fec.is_compiled(inputs, self.device):
                STATS.add(late_compiles=1)
                log.info("fcache: an nvFuser fusion compiles again for its real inputs")
        except RuntimeError:
            pass  # the call itself will tell

    def _fallback(self, inputs: list[torch.Tensor], exc: Exception) -> Sequence[torch.Tensor]:
        """nvFuser refused these inputs (say, strides unlike the traced ones): run eager."""
        if self._eager is None:
            log.warning("fcache: nvFuser failed at run time (%s); the region runs in eager", exc)
            self._eager = self.region.materialize(torch.device("cuda", self.device))
        STATS.add(runtime_fallbacks=1)
        return self._eager(*inputs)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _key(region_text: bytes, index: int) -> tuple[str, int]:
    return xxhash.xxh3_128_hexdigest(region_text), index


def compile_region(region: CanonicalRegion, device: torch.device) -> tuple[bytes, float]:
    """The artifact payload of a region and the seconds compiling it took."""
    index = _index(device)
    return _WORKER.submit(_compile, region, index).result()


def load_region(data: bytes, device: torch.device) -> Callable[[list[torch.Tensor]], Any]:
    """A runner for an artifact payload; raises CorruptArtifact or CompileError."""
    payload = decode(data)
    if payload.nvfuser != toolchain()["nvfuser"]:
        raise CorruptArtifact(f"payload of nvFuser {payload.nvfuser}, this is {nvf.version()}")
    index = _index(device)
    return _WORKER.submit(_load, payload, data, index).result().runner()


def _compile(region: CanonicalRegion, index: int) -> tuple[bytes, float]:
    start = time.perf_counter()
    key = _key(region.text, index)
    if (fusion := _FUSIONS.get(key)) is not None:
        STATS.add(reused=1)
        return fusion.payload, time.perf_counter() - start
    fusion, inputs, nvrtc = _build(region, index)
    db = _kernel_db()
    kernels = db.harvest(fusion.fd.fec.get_cuda_kernel(inputs, device=index)) if db else []
    fusion.payload = encode(
        Payload(
            region=region.text,
            definition=_printout(fusion.fd),
            nvfuser=toolchain()["nvfuser"],
            inputs=[_descriptor(t) for t in inputs],
            kernels=kernels,
        )
    )
    _FUSIONS[key] = fusion
    elapsed = time.perf_counter() - start
    STATS.add(
        compiles=1, compile_seconds=elapsed, nvrtc_compiles=nvrtc, kernels_harvested=len(kernels)
    )
    return fusion.payload, elapsed


def _load(payload: Payload, data: bytes, index: int) -> Fusion:
    start = time.perf_counter()
    key = _key(payload.region, index)
    if (fusion := _FUSIONS.get(key)) is not None:
        STATS.add(reused=1)
        return fusion
    try:
        region = parse(payload.region)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptArtifact(f"nvFuser payload's region does not parse: {exc}") from exc
    db = _kernel_db()
    restored = db.restore(payload.kernels) if db else 0
    fusion, _, nvrtc = _build(region, index)
    fusion.payload = data
    _FUSIONS[key] = fusion
    elapsed = time.perf_counter() - start
    STATS.add(loads=1, load_seconds=elapsed, nvrtc_compiles=nvrtc, kernels_restored=restored)
    return fusion


def _build(region: CanonicalRegion, index: int) -> tuple[Fusion, list[torch.Tensor], int]:
    """Define the region's fusion and compile it by one run on uninitialized inputs.

    Returns the fusion, the warm-up inputs and the number of NVRTC compiles it took."""
    start = time.perf_counter()
    error: Exception | None = None
    with nvf.FusionDefinition() as fd:
        try:
            translate(region, fd, _dtype)
        except Exception as exc:  # raised inside: FusionDefinition.__exit__ would print it
            error = exc
    if error is not None:
        raise CompileError(f"nvFuser definition failed: {type(error).__name__}: {error}") from error
    defined = time.perf_counter()
    STATS.add(define_seconds=defined - start)
    db = _kernel_db()
    with torch.cuda.device(index):
        inputs = [_empty(spec, index) for spec in region.inputs]
        rows = db.rows if db else 0
        try:
            fd.execute(inputs, device=index, _enable_options=["kernel_db"] if db else [])
        except RuntimeError as exc:
            raise CompileError(f"nvFuser compile failed: {exc}") from exc
    nvrtc = db.rows - rows if db else -1
    STATS.record_build(
        {
            "nodes": len(region.nodes),
            "ops": sorted({n.op.split(".")[1] if "." in n.op else n.op for n in region.nodes}),
            "define_s": round(defined - start, 4),
            "nvfuser_s": round(time.perf_counter() - defined, 4),
            "nvrtc": nvrtc,
        }
    )
    return Fusion(region, index, fd), inputs, nvrtc


def _printout(fd: Any) -> str:
    """nvFuser's Python printout of a definition, or why there is none (it is only shown)."""
    try:
        return repr(fd)
    except Exception as exc:  # a printer gap must not fail a compile
        return f"# no printout: {type(exc).__name__}: {exc}"


def _empty(spec: Any, index: int) -> torch.Tensor:
    device = torch.device("cpu") if spec.device_type == "cpu" else torch.device("cuda", index)
    return spec.empty(device)


def _descriptor(tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "sizes": list(tensor.shape),
        "strides": list(tensor.stride()),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "device": tensor.device.type,
    }


def _kernel_db() -> KernelDb | None:
    """The process's private kernel database, opened on first use (worker thread only)."""
    if not _KERNEL_DB:
        _KERNEL_DB.append(KernelDb.open())
    return _KERNEL_DB[0]
