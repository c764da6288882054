"""The compile pipeline for one aten graph: partition, canonicalize, key, look up, compile
on a miss, load, stitch.

A `Session` is the per-process service behind every model compiled with one `Settings`:
it owns the cache tiers, the in-process LRU of loaded regions and the executors, so two
models in a process (or the forward and backward of one) share loaded kernels. Regions
that are isomorphic within a graph are looked up once.

Failure contract: nothing in here makes a model fail that eager would run. A region no
executor can compile runs in eager (counted as a fallback); a cache tier that fails is a
counted miss (the tiered cache's contract).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.fx as fx

from fcache.cache.artifact import Artifact
from fcache.cache.memory import LoadedRegions
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.errors import CorruptArtifact
from fcache.executors import registry
from fcache.executors.base import CompiledRegion, Executor
from fcache.frontend.canonicalize import CanonicalRegion, NotCanonicalizable, canonicalize
from fcache.frontend.key import CacheKey, Target, make_key
from fcache.frontend.partition import Region, partition
from fcache.progress import Progress
from fcache.runtime import stitch
from fcache.stats import CacheStats, ModelStats

log = logging.getLogger(__name__)


@dataclass
class ModelRecord:
    """What compiling one model has cost so far; `snapshot()` is `fcache.stats(model)`."""

    graphs: int = 0
    regions: int = 0
    keys: set[str] = field(default_factory=set)
    compiles: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0
    fallbacks: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    misses: Counter[str] = field(default_factory=Counter)
    executors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> ModelStats:
        with self.lock:
            return ModelStats(
                graphs=self.graphs,
                regions=self.regions,
                unique_regions=len(self.keys),
                compiles=self.compiles,
                compile_seconds=self.compile_seconds,
                load_seconds=self.load_seconds,
                fallbacks=self.fallbacks,
                hits=dict(self.hits),
                misses=dict(self.misses),
                executors=dict(self.executors),
            )


class Session:
    """Per-process compile service for one Settings. Thread-safe."""

    _sessions: ClassVar[dict[Settings, Session]] = {}
    _sessions_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self.cache = TieredCache.open(settings, self.stats)
        self.loaded = LoadedRegions(settings.memory_entries, self.stats)
        # Compiles run on their own thread: Inductor and export must not see the Dynamo /
        # AOTAutograd tracing state of the thread that captured the graph.
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="fcache-compile")

    @classmethod
    def get(cls, settings: Settings) -> Session:
        with cls._sessions_lock:
            if settings not in cls._sessions:
                cls._sessions[settings] = cls(settings)
            return cls._sessions[settings]

    def executors(self, device_type: str) -> tuple[Executor, ...]:
        return registry.resolve(self.settings.executors, device_type)

    def compile_graph(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], label: str, *, record: ModelRecord
    ) -> Callable[[list[Any]], Any]:
        """An aten graph -> a boxed callable that runs it with compiled regions."""
        parts = partition(gm.graph)
        groups = _group(parts.regions, record)
        progress = Progress(f"{label} graph", len(groups), self.settings.progress)
        compiled: dict[Region, CompiledRegion] = {}
        for (canon, device), regions in groups.items():
            fn = self._obtain(canon, device, record, progress)
            compiled.update(dict.fromkeys(regions, fn))
        progress.close()
        self.cache.flush_stats()
        with record.lock:
            record.graphs += 1
        module = stitch(parts, compiled, gm)
        forward = module.forward
        forward._boxed_call = True  # type: ignore[attr-defined]
        return forward

    def _obtain(
        self, canon: CanonicalRegion, device: torch.device, record: ModelRecord, progress: Progress
    ) -> CompiledRegion:
        target = Target.of(device)
        for executor in self.executors(device.type):
            if not executor.supports(canon, target):
                continue
            key = make_key(canon, target, executor.name, executor.version, executor.toolchain(target))
            with record.lock:
                record.keys.add(key.digest)
                record.executors[executor.name] += 1
            memo = f"{key.digest}@{device}"
            fn = self.loaded.get(memo)
            if fn is not None:
                _count(record, hits=("memory",))
                progress.update(reused=1)
                return fn
            _count(record, misses=("memory",))
            try:
                fn = self._load_or_compile(executor, canon, key, device, record, progress)
            except Exception as exc:  # any executor failure: try the next executor
                log.warning("fcache: %s could not compile a region (%s); trying the next executor",
                            executor.name, exc)
                continue
            self.loaded.put(memo, fn)
            return fn
        raise AssertionError("the eager executor supports every region")

    def _load_or_compile(
        self,
        executor: Executor,
        canon: CanonicalRegion,
        key: CacheKey,
        device: torch.device,
        record: ModelRecord,
        progress: Progress,
    ) -> CompiledRegion:
        if not executor.persistent:
            return executor.load(executor.compile(canon, device), device)
        found = self.cache.get(key.digest)
        _count_tiers(record, self.cache.tier_names, found[1] if found else None)
        if found is not None:
            fn = self._load(executor, found[0], device, key, record)
            if fn is not None:
                progress.update(loaded=1)
                return fn
        with self.cache.compile_lease(key.digest) as ready:
            if ready is not None and (fn := self._load(executor, ready, device, key, record)):
                progress.update(loaded=1)
                return fn
            artifact = self._compile(executor, canon, key, device, record)
            self.cache.put(key.digest, artifact)
        progress.update(compiled=1)
        return executor.load(artifact, device)

    def _load(
        self, executor: Executor, artifact: Artifact, device: torch.device, key: CacheKey,
        record: ModelRecord,
    ) -> CompiledRegion | None:
        """Load a stored artifact; None (and the entry dropped) if it is unusable."""
        start = time.perf_counter()
        try:
            if (artifact.executor, artifact.executor_version) != (executor.name, executor.version):
                raise CorruptArtifact(f"artifact of {artifact.executor} under a {executor.name} key")
            fn = executor.load(artifact, device)
        except CorruptArtifact as exc:
            log.warning("fcache: dropping unusable artifact %s: %s", key.digest, exc)
            self.cache.discard(key.digest)
            return None
        with record.lock:
            record.load_seconds += time.perf_counter() - start
        return fn

    def _compile(
        self, executor: Executor, canon: CanonicalRegion, key: CacheKey, device: torch.device,
        record: ModelRecord,
    ) -> Artifact:
        artifact = self._compiler.submit(executor.compile, canon, device).result()
        self.stats.add("local", compiles=1, compile_seconds=artifact.compile_seconds)
        with record.lock:
            record.compiles += 1
            record.compile_seconds += artifact.compile_seconds
        # The key's components and the region travel with the artifact, for `fcache explain`.
        meta = {f"key.{name}": value for name, value in key.components}
        meta["region"] = canon.text.decode()
        return dataclasses.replace(artifact, meta={**artifact.meta, **meta})


def _group(
    regions: Sequence[Region], record: ModelRecord
) -> dict[tuple[CanonicalRegion, torch.device], list[Region]]:
    """Regions by (canonical form, device): isomorphic regions are looked up once.
    Regions with no canonical form are left out: they run in eager."""
    by_text: dict[tuple[bytes, torch.device], tuple[CanonicalRegion, list[Region]]] = {}
    for region in regions:
        try:
            canon = canonicalize(region)
            device = _device(region)
        except NotCanonicalizable as exc:
            log.debug("region %d runs in eager: %s", region.index, exc)
            with record.lock:
                record.fallbacks += 1
            continue
        by_text.setdefault((canon.text, device), (canon, []))[1].append(region)
    with record.lock:
        record.regions += len(regions)
    return {(canon, device): members for (_, device), (canon, members) in by_text.items()}


def _device(region: Region) -> torch.device:
    """The one device a region computes on (CPU scalars may join a GPU region)."""
    devices = {
        value.device
        for node in (*region.inputs, *region.outputs)
        for value in _tensors(node.meta.get("val"))
    }
    accelerators = {d for d in devices if d.type != "cpu"}
    if len(accelerators) > 1:
        raise NotCanonicalizable(f"region spans devices {sorted(map(str, accelerators))}")
    return accelerators.pop() if accelerators else torch.device("cpu")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _count(record: ModelRecord, hits: Sequence[str] = (), misses: Sequence[str] = ()) -> None:
    with record.lock:
        record.hits.update(hits)
        record.misses.update(misses)


def _count_tiers(record: ModelRecord, tiers: Sequence[str], hit: str | None) -> None:
    """A hit in tier T means a miss in every tier above it; no hit, a miss in all."""
    above = list(tiers) if hit is None else list(tiers[: list(tiers).index(hit)])
    _count(record, hits=(hit,) if hit else (), misses=above)
