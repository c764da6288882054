"""The nvFuser executor: a region becomes an nvFuser fusion (one per segment where nvFuser
segments it), on NVIDIA GPUs.

This module is the guard (Thunder's nvfuserex.py / nvfuserex_impl.py split): importing
it imports neither nvFuser nor CUDA, so `import fcache` works on a laptop. `supports` is
a pure-Python check of the region's ops, arguments and dtypes against the translation
table (`translate`); `toolchain`, `compile` and `load` import `runtime`, which imports
`nvfuser_direct`, on first use.

  translate    region -> fusion definition: the op table, the cheap check, the driver;
               the translators by family in elementwise, reductions, shapes, on builder
  runtime      FusionRuntime: builds, compiles and loads fusions (imports nvFuser)
  segments     a segmented fusion cut along nvFuser's segments into steps (pure Python)
  kernel_db    nvFuser's kernel database in a private directory, harvested and restored
  payload      the artifact's bytes
  stats        NvFuserStats, the executor's counters

Key: `toolchain` adds nvFuser's version (with its git sha), the CUDA and torch versions
and the NVFUSER_ENABLE / NVFUSER_DISABLE options to the key; the GPU's compute
capability is already in the key's target. Artifact: see `payload`.

A region that has an op nvFuser cannot take is declined by `supports` (and counted in
`stats()["declined"]`, by reason), so the pipeline hands it to the next executor; one
that fails to translate or compile raises from `compile`, with the same effect.

State: an executor owns its counters (`stats()`) and, from its first compile or load,
one FusionRuntime: its worker thread, its fusion tables and the kernel database;
`close()` closes that runtime (stats stay). Make executors with `registry.create`, one
per process: nvFuser's kernel database is a process-wide native singleton, which a
second runtime would re-point at its own directory (see `runtime`).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fcache.cache.artifact import Artifact
from fcache.executors.base import CompiledRegion
from fcache.executors.nvfuser.stats import NvFuserStats
from fcache.executors.nvfuser.translate import unsupported
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target

if TYPE_CHECKING:
    from fcache.executors.nvfuser.runtime import FusionRuntime

log = logging.getLogger(__name__)


def installed() -> bool:
    """Whether `nvfuser_direct` can be imported (found, not imported: no CUDA touched)."""
    return importlib.util.find_spec("nvfuser_direct") is not None


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
    """The nvFuser executor (see the module docstring). Thread-safe."""

    name = "nvfuser"
    # Bump when the translation or the payload changes what a stored artifact means.
    version = "2"
    persistent = True
    # load() re-segments the fusion anyway: a worker's compile would be done twice.
    compile_in_worker = False
    # It fuses elementwise ops and reductions, not matmuls or attention: graphs are cut by
    # op where it is asked first (fcache.executors.base.whole_layers).
    whole_layers = False

    def __init__(self) -> None:
        self._stats = NvFuserStats()
        self._lock = threading.Lock()
        self._runtime: FusionRuntime | None = None  # made on the first compile or load

    def available(self, device_type: str) -> bool:
        """CUDA regions, where nvfuser_direct is installed (nothing imported to tell)."""
        return device_type == "cuda" and installed()

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        if target.device_type != "cuda":
            return False
        reasons = unsupported(region) + _poor_fits(region)
        if reasons:
            self._stats.decline(reasons)
            log.debug("nvFuser declines a region: %s", "; ".join(reasons))
        return not reasons

    def toolchain(self, target: Target) -> Mapping[str, str]:
        from fcache.executors.nvfuser import runtime

        return runtime.toolchain()

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        from fcache.executors.nvfuser import runtime

        payload, seconds = self._fusions().compile_region(region, device)
        return Artifact(
            self.name,
            self.version,
            payload,
            compile_seconds=seconds,
            producer={k: v for k, v in runtime.toolchain().items() if k != "options"},
        )

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        return self._fusions().load_region(artifact.payload, device)

    def stats(self) -> dict[str, Any]:
        """A copy of this executor's counters (see NvFuserStats)."""
        return self._stats.snapshot()

    def close(self) -> None:
        """Close the runtime, if one was made: its worker thread stops after the builds in
        flight and the kernel database's directory goes. Regions loaded before keep
        running; a later compile or load makes a new runtime. Counters stay."""
        with self._lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()

    def _fusions(self) -> FusionRuntime:
        with self._lock:
            if self._runtime is None:
                from fcache.executors.nvfuser.runtime import FusionRuntime

                self._runtime = FusionRuntime(self._stats)
            return self._runtime
