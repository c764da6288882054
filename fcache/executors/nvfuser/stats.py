"""What one nvFuser executor did: counters, declines by reason, and a log of builds.

Thread-safe: every change goes through a method that takes the object's lock, and
`snapshot` returns a deep copy. Each `NvFuserExecutor` owns one; its runtime (and the
fusions it builds) count into it.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class NvFuserStats:
    """What one nvFuser executor did (the registry makes one per process). Thread-safe.

    compiles / compile_seconds     fusions built by `compile` (a cache miss): definition,
                                   then nvFuser's segmentation, scheduling, lowering, NVRTC
    loads / load_seconds           fusions built by `load` from an artifact (a warm start):
                                   the same steps, with NVRTC answered by the kernel_db
    define_seconds                 of either, the Python translation into a definition
    reused                         compile/load calls answered by a fusion this executor
                                   already built (one fusion per region and device)
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
