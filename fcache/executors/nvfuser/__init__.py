"""The nvFuser executor: a region becomes an nvFuser fusion (one per segment where nvFuser
segments it), on NVIDIA GPUs.

This module is the guard (Thunder's nvfuserex.py / nvfuserex_impl.py split): importing
it imports neither nvFuser nor CUDA, so `import fcache` works on a laptop. `supports` is
a pure-Python check of the region's ops, arguments and dtypes against the translation
table (`translate`); `toolchain`, `compile` and `load` import `runtime`,
which imports `nvfuser_direct`, on first use.

Key: `toolchain` adds nvFuser's version (with its git sha), the CUDA and torch versions
and the NVFUSER_ENABLE / NVFUSER_DISABLE options to the key; the GPU's compute
capability is already in the key's target. Artifact: see `payload`.

A region that has an op nvFuser cannot take is declined by `supports` (and counted in
`stats()["declined"]`, by reason), so the pipeline hands it to the next executor; one
that fails to translate or compile raises from `compile`, with the same effect.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from fcache.cache.artifact import Artifact
from fcache.executors.base import CompiledRegion
from fcache.executors.nvfuser.translate import unsupported
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target

log = logging.getLogger(__name__)


@dataclass
class NvFuserStats:
    """What the nvFuser executor did in this process. Thread-safe through `add`.

    compiles / compile_seconds     fusions built by `compile` (a cache miss): definition,
                                   then nvFuser's segmentation, scheduling, lowering, NVRTC
    loads / load_seconds           fusions built by `load` from an artifact (a warm start):
                                   the same steps, with NVRTC answered by the kernel_db
    define_seconds                 of either, the Python translation into a definition
    reused                         compile/load calls answered by a fusion already built
                                   in this process (one fusion per region and device)
    nvrtc_compiles                 kernels NVRTC compiled (kernel_db entries written by
                                   nvFuser during our compiles; -1 per build without db)
    kernels_harvested / _restored  kernel_db entries put into artifacts / taken from them
    cut_regions / steps            compiles nvFuser segmented that were cut along its
                                   segments into steps, one fusion each (a warm load of
                                   those skips the segmentation search), and the steps
    late_compiles                  fusions that compiled again on their first real call
                                   (inputs unlike the warm-up's, e.g. in alignment)
    runtime_fallbacks              calls nvFuser refused at run time, run in eager instead
    declined                       regions `supports` turned down, by reason
    builds                         per fusion built: kind, node count, op names, seconds
                                   (definition, nvFuser) and NVRTC compiles, in order
    """

    compiles: int = 0
    compile_seconds: float = 0.0
    loads: int = 0
    load_seconds: float = 0.0
    define_seconds: float = 0.0
    reused: int = 0
    nvrtc_compiles: int = 0
    kernels_harvested: int = 0
    kernels_restored: int = 0
    cut_regions: int = 0
    steps: int = 0
    late_compiles: int = 0
    runtime_fallbacks: int = 0
    declined: Counter[str] = field(default_factory=Counter)
    builds: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: float) -> None:
        with self.lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)

    def decline(self, reasons: list[str]) -> None:
        with self.lock:
            self.declined.update(reasons)

    def record_build(self, build: dict[str, Any]) -> None:
        with self.lock:
            self.builds.append(build)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                f.name: copy.deepcopy(getattr(self, f.name))
                for f in fields(self)
                if f.name != "lock"
            }


STATS = NvFuserStats()


def stats() -> dict[str, Any]:
    """A copy of this process's nvFuser executor counters (see NvFuserStats)."""
    return STATS.snapshot()


def _poor_fits(region: CanonicalRegion) -> list[str]:
    """Regions nvFuser can translate but handles much worse than the next executor.

    A strided slice_scatter (RoPE's backward writes the even and odd lanes) becomes
    reshapes, pads and a `where`, which nvFuser segments into several kernels per region
    (still 5-6 with a pad-free translation, tried and dropped). Measured with that one on
    the H100 (2-layer Llama example, d=1024, bf16), nvFuser taking the two RoPE-backward
    regions against leaving them to the next executor, segmented regions stored cut:
    nvFuser's compile 22.9 s against 8.4 s cold (5.4-5.9 s per region), its load 8.6 s
    against 6.7 s warm, and a slower steady step (8.5 ms against 8.0 ms with those
    regions in eager). Inductor makes one kernel of each, compiles them in worker
    processes alongside nvFuser's compiles, and its packages load in milliseconds
    (bench/results/gpu-h100-rope-backward.json)."""
    reasons = []
    for node in region.nodes:
        if node.op == "aten.slice_scatter.default":
            # slice_scatter(self, src, dim=0, start=None, end=None, step=1)
            step = node.args[5] if len(node.args) > 5 else node.kwargs.get("step", 1)
            if step != 1:
                reasons.append(f"{node.op}: a strided (step {step}) scatter segments poorly")
    return reasons


class NvFuserExecutor:
    name = "nvfuser"
    # Bump when the translation or the payload changes what a stored artifact means.
    version = "2"
    persistent = True
    # load() re-segments the fusion anyway: a worker's compile would be done twice.
    compile_in_worker = False

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        if target.device_type != "cuda":
            return False
        reasons = unsupported(region) + _poor_fits(region)
        if reasons:
            STATS.decline(reasons)
            log.debug("nvFuser declines a region: %s", "; ".join(reasons))
        return not reasons

    def toolchain(self, target: Target) -> Mapping[str, str]:
        from fcache.executors.nvfuser import runtime

        return runtime.toolchain()

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        from fcache.executors.nvfuser import runtime

        payload, seconds = runtime.compile_region(region, device)
        return Artifact(
            self.name,
            self.version,
            payload,
            compile_seconds=seconds,
            producer={k: v for k, v in runtime.toolchain().items() if k != "options"},
        )

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        from fcache.executors.nvfuser import runtime

        return runtime.load_region(artifact.payload, device)
