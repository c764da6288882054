"""The executor protocol: canonical region -> Artifact -> loaded callable.

An executor is a compiler backend seen through five questions: can you run on this kind of
device at all (`available`), can you compile this region for this target (`supports`),
what besides the region changes your output (`toolchain`), compile it (`compile`, the slow
path a cache hit skips), and turn stored bytes back into a callable (`load`, the fast
path). `compile` and `load` must be pure functions of their
arguments: the artifact of one process is loaded by others, on other machines.

Calling convention of a loaded region: `fn(inputs: list[Tensor]) -> Sequence[Tensor]`,
inputs and outputs in the canonical region's order. A list in, a list out: no argument
unpacking on the hot path (the stitched graph calls it once per region per step).

An executor holding process-wide resources (threads, tables of built kernels) may define
`close()`; the registry creates one executor per name and process, and `process.reset()`
closes it. Adding one: see `fcache.executors.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from fcache.cache.artifact import Artifact
from fcache.frontend.canonicalize import CanonicalRegion
from fcache.target import Target

CompiledRegion = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


def unchecked(fn: CompiledRegion) -> CompiledRegion:
    """`fn`'s variant that does not check its inputs' sizes and strides (an executor may
    give a loaded region one as its `unchecked` attribute), else `fn`. Only for a caller
    that has checked those against the region's traced inputs itself."""
    return getattr(fn, "unchecked", None) or fn


def whole_layers(executor: object) -> bool:
    """Whether graphs are cut by layer for `executor` (asked first on the device): whether it
    compiles a layer's region whole, matmuls and attention inside (its `whole_layers`
    attribute; True if it has none, as Inductor and eager do). An executor that fuses
    elementwise ops only says False: graphs are then cut by op."""
    return bool(getattr(executor, "whole_layers", True))


class Executor(Protocol):
    name: str
    # Bump when artifacts of the previous version must not be loaded any more.
    version: str
    # False for executors whose artifacts are cheaper to rebuild than to store (eager).
    persistent: bool
    # Whether compiling in a worker process saves the parent work. False when `load` has
    # to redo what `compile` did (nvFuser re-segments every fusion it loads).
    compile_in_worker: bool

    def available(self, device_type: str) -> bool:
        """Whether this executor can run on that device type in this process at all (its
        backend installed, the device kind handled). Cheap: imports no backend."""
        ...

    def supports(self, region: CanonicalRegion, target: Target) -> bool:
        """Cheap check, no compiling: every op and dtype of the region is handled."""
        ...

    def toolchain(self, target: Target) -> Mapping[str, str]:
        """Versions and options that change this executor's output for `target`."""
        ...

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        """Compile the region. Raises CompileError (or anything) on failure: the region then
        goes to the next executor. Must not depend on anything but its arguments."""
        ...

    def load(self, artifact: Artifact, device: torch.device) -> CompiledRegion:
        """Turn an artifact (possibly from another process or machine) into a callable on
        `device`, without compiling. Raises CorruptArtifact if the payload is unusable."""
        ...
