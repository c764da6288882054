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

Segmented regions: after a cold compile, a fusion nvFuser cut into several kernels is
cut the same way into steps (`segments`), one fusion each, and the artifact
carries the steps. A warm load then defines each step's fusion, which nvFuser takes
whole, and skips the segmentation search that 0.2.36 cannot persist.

In-process sharing: fusions and plans live in the runtime's table keyed by (region,
device index), so isomorphic regions (and isomorphic steps), from any model or Session,
share one definition and one executor cache; `compile` of a region already built
returns its payload, `load` of its artifact returns a runner on the same fusion.

Ownership: a FusionRuntime holds the worker thread, the fusion and step tables and the
kernel database; the executor makes it on its first compile or load and closes it in
its `close()`. The kernel database behind it is nvFuser's process-wide singleton, which
opening re-points at the runtime's private directory: so one runtime per process (the
registry makes one executor per process); a second one would leave the first harvesting
from a directory nvFuser no longer writes (its artifacts then carry no kernels).

Threading: every build, harvest and restore runs on one worker thread, started on first
use. That serializes use of nvFuser's process-wide kernel database and of its global
option guards, and keeps the calling thread's state (AOTAutograd's dispatch modes, its
current device) out of the warm-up. `compile_region` and `load_region` may be called from
any thread; runners execute on the caller's thread.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import nvfuser_direct as nvf
import torch
import xxhash

import fcache.executors.nvfuser.segments as segments
from fcache.errors import CompileError, CorruptArtifact
from fcache.executors.eager import eager_module
from fcache.executors.nvfuser.builder import DTYPE_NAMES, Builder
from fcache.executors.nvfuser.kernel_db import Kernel, KernelDb
from fcache.executors.nvfuser.payload import Payload, StepRecord, decode, encode
from fcache.executors.nvfuser.stats import NvFuserStats
from fcache.executors.nvfuser.translate import translate
from fcache.frontend.canonicalize import CanonicalRegion, Ref, TensorSpec, parse

log = logging.getLogger(__name__)

_TENSOR_NAME = re.compile(r"^T(\d+)_")
T = TypeVar("T")


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
    """A built, compiled fusion and what a runner needs. Owned by its runtime's tables."""

    region: CanonicalRegion
    device: int
    fd: Any
    stats: NvFuserStats = field(repr=False)  # its runtime's: counts late compiles, fallbacks
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
                self.stats.add(late_compiles=1)
                log.info("fcache: an nvFuser fusion compiles again for its real inputs")
        except RuntimeError:
            pass  # the call itself will tell

    def _fallback(self, inputs: list[torch.Tensor], exc: Exception) -> Sequence[torch.Tensor]:
        """nvFuser refused these inputs (say, strides unlike the traced ones): run eager."""
        if self._eager is None:
            log.warning("fcache: nvFuser failed at run time (%s); the region runs in eager", exc)
            self._eager = eager_module(self.region, torch.device("cuda", self.device))
        self.stats.add(runtime_fallbacks=1)
        return self._eager(*inputs)


@dataclass(eq=False)
class Plan:
    """A region run as steps, each a Fusion of its own (see the module docstring)."""

    region: CanonicalRegion
    steps: list[tuple[Fusion, tuple[Ref, ...], tuple[Ref, ...]]]  # fusion, reads, writes
    payload: bytes = b""

    def runner(self) -> Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]:
        # Region values get list slots once, here, so a call does no hashing. Each step's
        # runner falls back to eager on its own if nvFuser refuses its inputs.
        slots = {Ref("in", i): i for i in range(len(self.region.inputs))}
        plan = []
        for fusion, reads, writes in self.steps:
            ins = [slots[r] for r in reads]
            outs = [slots.setdefault(r, len(slots)) for r in writes]
            plan.append((fusion.runner(), ins, outs))
        results = [slots[r] for r in self.region.outputs]
        size = len(slots)

        def run(inputs: list[torch.Tensor]) -> Sequence[torch.Tensor]:
            env: list[Any] = [*inputs, *[None] * (size - len(inputs))]
            for step_run, ins, outs in plan:
                for slot, value in zip(outs, step_run([env[i] for i in ins]), strict=True):
                    env[slot] = value
            return [env[i] for i in results]

        return run


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _key(region_text: bytes, index: int) -> tuple[str, int]:
    return xxhash.xxh3_128_hexdigest(region_text), index


class FusionRuntime:
    """One executor's nvFuser state: the worker thread, the fusion tables, the kernel
    database (see the module docstring). Counts into the executor's `stats`."""

    def __init__(self, stats: NvFuserStats) -> None:
        self._stats = stats
        self._lock = threading.Lock()  # guards _worker and _closed
        self._worker: ThreadPoolExecutor | None = None  # started by the first _submit
        self._closed = False
        # Touched on the worker only. Regions (each with its artifact payload), and the
        # fusions of steps (no payload of their own), by (canonical text hash, device index).
        self._fusions: dict[tuple[str, int], Fusion | Plan] = {}
        self._steps: dict[tuple[str, int], Fusion] = {}
        self._db: KernelDb | None = None
        self._db_opened = False  # the first try opens it, or finds it cannot (None)

    def compile_region(self, region: CanonicalRegion, device: torch.device) -> tuple[bytes, float]:
        """The artifact payload of a region and the seconds compiling it took."""
        index = _index(device)
        return self._submit(self._compile, region, index).result()

    def load_region(self, data: bytes, device: torch.device) -> Callable[[list[torch.Tensor]], Any]:
        """A runner for an artifact payload; raises CorruptArtifact or CompileError."""
        payload = decode(data)
        if payload.nvfuser != toolchain()["nvfuser"]:
            raise CorruptArtifact(f"payload of nvFuser {payload.nvfuser}, this is {nvf.version()}")
        index = _index(device)
        try:
            return self._submit(self._load, payload, data, index).result().runner()
        except CompileError as exc:  # it compiled where it was made, not here: unusable here
            raise CorruptArtifact(f"nvFuser payload does not build: {exc}") from exc

    def close(self) -> None:
        """Stop the worker once the builds in flight are done, and remove the kernel
        database's directory. Runners made before keep working (they need neither)."""
        with self._lock:
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)
        if self._db is not None:
            self._db.close()

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError("fcache: this nvFuser runtime is closed")
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="fcache-nvfuser")
            return self._worker.submit(fn, *args)

    def _compile(self, region: CanonicalRegion, index: int) -> tuple[bytes, float]:
        start = time.perf_counter()
        key = _key(region.text, index)
        if (done := self._fusions.get(key)) is not None:
            self._stats.add(reused=1)
            return done.payload, time.perf_counter() - start
        whole = self._build(region, index)
        nvrtc = whole.nvrtc
        try:
            cut = self._cut(region, whole, index)
        except Exception as exc:  # a cut only makes later loads faster: never fail a compile on it
            log.warning("fcache: an nvFuser fusion is kept whole: its cut failed (%s)", exc)
            cut = None
        built: Fusion | Plan = whole.fusion
        parts = [(whole.fusion, whole.inputs)]
        records: list[StepRecord] = []
        if cut is not None:
            built, parts, records, more = cut
            nvrtc += more
            self._stats.add(cut_regions=1, steps=len(records))
        db = self._kernel_db()
        kernels = _harvest(db, parts, index) if db else []
        built.payload = encode(
            Payload(
                region=region.text,
                definition=_printout(whole.fusion.fd),
                nvfuser=toolchain()["nvfuser"],
                inputs=[_descriptor(t) for t in whole.inputs],
                kernels=kernels,
                steps=records,
            )
        )
        self._fusions[key] = built
        elapsed = time.perf_counter() - start
        self._stats.add(
            compiles=1,
            compile_seconds=elapsed,
            nvrtc_compiles=nvrtc,
            kernels_harvested=len(kernels),
        )
        return built.payload, elapsed

    def _cut(
        self, region: CanonicalRegion, whole: _Built, index: int
    ) -> tuple[Plan, list[tuple[Fusion, list[torch.Tensor]]], list[StepRecord], int] | None:
        """The region as steps along the segments nvFuser chose for `whole`, each step's fusion
        built (and so compiled) on the outputs of the steps before it; None to keep `whole`."""
        try:
            found = segments.parse(whole.fusion.fd.fec.get_scheduled_ir(whole.inputs, device=index))
        except Exception as exc:  # only a view of nvFuser's decisions: without it, no cut
            log.debug("fcache: no nvFuser segments to read (%s)", exc)
            return None
        names = _names(region, whole.builder) if found is not None else None
        if found is None or names is None:
            return None
        values = whole.builder.values
        steps = segments.plan(
            region, found, names, lambda r: isinstance(values[r].meta, torch.Tensor)
        )
        if steps is None:
            return None
        env: dict[Ref, torch.Tensor] = {Ref("in", i): t for i, t in enumerate(whole.inputs)}
        built: list[tuple[Fusion, tuple[Ref, ...], tuple[Ref, ...]]] = []
        parts: list[tuple[Fusion, list[torch.Tensor]]] = []
        records: list[StepRecord] = []
        nvrtc = 0
        for step in steps:
            sub = step.region(region, lambda r: TensorSpec.of(env[r]))
            reads = [env[r] for r in step.inputs]
            fusion, outs, compiled = self._step(sub, index, reads)
            nvrtc += compiled
            env.update(zip(step.outputs, outs, strict=True))
            built.append((fusion, step.inputs, step.outputs))
            parts.append((fusion, reads))
            records.append(StepRecord(sub.text, _pairs(step.inputs), _pairs(step.outputs)))
        return Plan(region, built), parts, records, nvrtc

    def _step(
        self, sub: CanonicalRegion, index: int, reads: list[torch.Tensor] | None = None
    ) -> tuple[Fusion, list[torch.Tensor], int]:
        """A step's fusion, built unless this runtime has one (as a step, or as a region of
        its own); with its outputs on `reads` when given, and the NVRTC compiles it took."""
        key = _key(sub.text, index)
        found = self._steps.get(key) or self._fusions.get(key)
        if isinstance(found, Fusion):
            self._stats.add(reused=1)
            if reads is None:
                return found, [], 0
            with torch.cuda.device(index):
                return found, found.fd.execute(reads, device=index), 0
        part = self._build(sub, index, reads)
        self._steps[key] = part.fusion
        return part.fusion, part.outputs, part.nvrtc

    def _load(self, payload: Payload, data: bytes, index: int) -> Fusion | Plan:
        start = time.perf_counter()
        key = _key(payload.region, index)
        if (done := self._fusions.get(key)) is not None:
            self._stats.add(reused=1)
            return done
        region = _parse(payload.region)
        db = self._kernel_db()
        restored = db.restore(payload.kernels) if db else 0
        built: Fusion | Plan
        if payload.steps:
            built, nvrtc = self._load_plan(region, payload.steps, index)
        else:
            whole = self._build(region, index)
            built, nvrtc = whole.fusion, whole.nvrtc
        built.payload = data
        self._fusions[key] = built
        elapsed = time.perf_counter() - start
        self._stats.add(
            loads=1, load_seconds=elapsed, nvrtc_compiles=nvrtc, kernels_restored=restored
        )
        return built

    def _load_plan(
        self, region: CanonicalRegion, records: Sequence[StepRecord], index: int
    ) -> tuple[Plan, int]:
        written = {Ref("in", i) for i in range(len(region.inputs))}
        steps: list[tuple[Fusion, tuple[Ref, ...], tuple[Ref, ...]]] = []
        nvrtc = 0
        for record in records:
            reads = tuple(Ref(*r) for r in record.inputs)
            writes = tuple(Ref(*r) for r in record.outputs)
            sub = _parse(record.region)
            if not set(reads) <= written or (len(reads), len(writes)) != (
                len(sub.inputs),
                len(sub.outputs),
            ):
                raise CorruptArtifact("nvFuser payload's steps do not fit together")
            written.update(writes)
            fusion, _, compiled = self._step(sub, index)
            nvrtc += compiled
            steps.append((fusion, reads, writes))
        if not set(region.outputs) <= written:
            raise CorruptArtifact("nvFuser payload's steps leave region outputs unwritten")
        return Plan(region, steps), nvrtc

    def _build(
        self, region: CanonicalRegion, index: int, inputs: list[torch.Tensor] | None = None
    ) -> _Built:
        """Define the region's fusion and compile it by one run on `inputs` (by default,
        uninitialized tensors of the region's input layouts)."""
        start = time.perf_counter()
        error: Exception | None = None
        with nvf.FusionDefinition() as fd:
            try:
                builder = translate(region, fd, _dtype)
            except Exception as exc:  # raised inside: FusionDefinition.__exit__ would print it
                error = exc
        if error is not None:
            raise CompileError(
                f"nvFuser definition failed: {type(error).__name__}: {error}"
            ) from error
        defined = time.perf_counter()
        self._stats.add(define_seconds=defined - start)
        db = self._kernel_db()
        with torch.cuda.device(index):
            if inputs is None:
                inputs = [_empty(spec, index) for spec in region.inputs]
            rows = db.rows if db else 0
            try:
                outputs = fd.execute(
                    inputs, device=index, _enable_options=["kernel_db"] if db else []
                )
            except RuntimeError as exc:
                raise CompileError(f"nvFuser compile failed: {exc}") from exc
        nvrtc = db.rows - rows if db else -1
        self._stats.record_build(
            {
                "nodes": len(region.nodes),
                "ops": sorted({n.op.split(".")[1] if "." in n.op else n.op for n in region.nodes}),
                "define_s": round(defined - start, 4),
                "nvfuser_s": round(time.perf_counter() - defined, 4),
                "nvrtc": nvrtc,
            }
        )
        return _Built(Fusion(region, index, fd, self._stats), builder, inputs, outputs, nvrtc)

    def _kernel_db(self) -> KernelDb | None:
        """The runtime's private kernel database, opened on first use (worker thread only)."""
        if not self._db_opened:
            self._db_opened = True
            self._db = KernelDb.open()
        return self._db


def _names(region: CanonicalRegion, builder: Builder) -> segments.Names | None:
    """Which region value each of the fusion's tensors belongs to, by tensor name."""

    def names(value: Any) -> list[int]:
        tensors = value if isinstance(value, (tuple, list)) else (value,)
        return [int(m.group(1)) for t in tensors if (m := _TENSOR_NAME.match(str(t)))]

    values = builder.values
    inputs = [names(values[Ref("in", i)].nv) for i in range(len(region.inputs))]
    outputs = [names(tv) for tv in builder.outputs]
    if any(len(n) != 1 for n in inputs + outputs):
        return None  # not nvFuser's printout (this nvFuser prints tensors otherwise)
    nodes = [names(values[Ref("node", j)].nv) for j in range(len(region.nodes))]
    return segments.Names([n[0] for n in inputs], nodes, [n[0] for n in outputs], region)


def _harvest(
    db: KernelDb, parts: list[tuple[Fusion, list[torch.Tensor]]], index: int
) -> list[Kernel]:
    """The kernel_db entries of the fusions' kernels, each once (steps' kernels may share a
    name, never their code)."""
    kernels: dict[bytes, Kernel] = {}
    for fusion, inputs in parts:
        try:
            code = fusion.fd.fec.get_cuda_kernel(inputs, device=index)
        except RuntimeError as exc:  # a step without a kernel (views only) has no code
            log.debug("fcache: no kernel code for an nvFuser fusion (%s)", exc)
            continue
        for kernel in db.harvest(code):
            kernels.setdefault(kernel.code, kernel)
    return list(kernels.values())


def _pairs(refs: Sequence[Ref]) -> tuple[tuple[str, int], ...]:
    return tuple((r.kind, r.index) for r in refs)


def _parse(text: bytes) -> CanonicalRegion:
    try:
        return parse(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptArtifact(f"nvFuser payload's region does not parse: {exc}") from exc


class _Built(NamedTuple):
    fusion: Fusion
    builder: Builder
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    nvrtc: int  # NVRTC compiles it took (-1 without a kernel database)


def _printout(fd: Any) -> str:
    """nvFuser's Python printout of a definition, or why there is none (it is only shown)."""
    try:
        return repr(fd)
    except Exception as exc:  # a printer gap must not fail a compile
        return f"# no printout: {type(exc).__name__}: {exc}"


def _empty(spec: Any, index: int) -> torch.Tensor:
    return spec.empty(torch.device("cuda", index))


def _descriptor(tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "sizes": list(tensor.shape),
        "strides": list(tensor.stride()),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "device": tensor.device.type,
    }
