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
from concurrent.futures import ThreadPoolExecutor, as_completed
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
from fcache.frontend.key import CacheKey, make_key
from fcache.frontend.partition import Region, partition
from fcache.progress import Progress
from fcache.runtime import stitch
from fcache.stats import CacheStats, ModelStats
from fcache.target import Target
from fcache.workers import CompilePool

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


@dataclass(eq=False)
class _Job:
    """One unique region of a graph on its way to a callable."""

    canon: CanonicalRegion
    device: torch.device
    regions: list[Region]
    candidates: list[Executor]  # executors still to try, in order; eager is last
    key: CacheKey | None = None  # the key under candidates[0]
    fn: CompiledRegion | None = None
    first: str = field(init=False)  # the executor asked for first, to count fallbacks

    def __post_init__(self) -> None:
        self.first = self.candidates[0].name

    @property
    def executor(self) -> Executor:
        return self.candidates[0]


class Session:
    """Per-process compile service for one Settings. Thread-safe."""

    _sessions: ClassVar[dict[Settings, Session]] = {}
    _sessions_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self.cache = TieredCache.open(settings, self.stats)
        self.loaded: LoadedRegions[CompiledRegion] = LoadedRegions(
            settings.memory_entries, self.stats
        )
        self.pool = CompilePool(settings.compile_workers)

    @classmethod
    def get(cls, settings: Settings) -> Session:
        with cls._sessions_lock:
            if settings not in cls._sessions:
                cls._sessions[settings] = cls(settings)
            return cls._sessions[settings]

    def compile_graph(
        self, gm: fx.GraphModule, example_inputs: Sequence[Any], label: str, *, record: ModelRecord
    ) -> Callable[[list[Any]], Any]:
        """An aten graph -> a boxed callable that runs it with compiled regions."""
        parts = partition(gm.graph)
        jobs = [
            _Job(
                canon, device, regions, list(registry.resolve(self.settings.executors, device.type))
            )
            for (canon, device), regions in _group(parts.regions, record).items()
        ]
        progress = Progress(f"{label} graph", len(jobs), self.settings.progress)
        pending = jobs
        while pending:  # each round, a job either gets a callable or moves to its next executor
            misses = [job for job in pending if not self._lookup(job, record, progress)]
            pending = self._compile(misses, record, progress)
        progress.close()
        self.cache.flush_stats()
        with record.lock:
            record.graphs += 1
        module = stitch(parts, {r: job.fn for job in jobs for r in job.regions if job.fn}, gm)
        # FX gives every GraphModule its own class, so marking the class's function marks
        # only this graph's forward as taking AOTAutograd's boxed (list) arguments.
        module.forward.__func__._boxed_call = True  # type: ignore[attr-defined]
        return module.forward

    def _choose(self, job: _Job) -> CacheKey:
        """Skip executors that do not support the region; the key under the first that does."""
        target = Target.of(job.device)
        while not job.executor.supports(job.canon, target):
            job.candidates.pop(0)  # eager supports everything, so this ends
        executor = job.executor
        job.key = make_key(
            job.canon, target, executor.name, executor.version, executor.toolchain(target)
        )
        return job.key

    def _finish(self, job: _Job, fn: CompiledRegion, record: ModelRecord) -> None:
        assert job.key is not None
        job.fn = fn
        self.loaded.put(_memo(job.key, job.device), fn)
        with record.lock:
            record.keys.add(job.key.digest)
            record.executors[job.executor.name] += 1
            if job.executor.name == "eager" and job.first != "eager":
                record.fallbacks += 1

    # Hits ----------------------------------------------------------------------------------

    def _lookup(self, job: _Job, record: ModelRecord, progress: Progress) -> bool:
        """Find a callable for the job without compiling; False if it must be compiled."""
        key = self._choose(job)
        executor = job.executor
        if (fn := self.loaded.get(_memo(key, job.device))) is not None:
            _count(record, hits=("memory",))
            progress.update(reused=1)
            self._finish(job, fn, record)
            return True
        _count(record, misses=("memory",))
        if not executor.persistent:  # cheaper to build than to store: never cached
            self._finish(
                job, executor.load(executor.compile(job.canon, job.device), job.device), record
            )
            return True
        found = self.cache.get(key.digest)
        _count_tiers(record, self.cache.tiers, found[1] if found else None)
        if found is not None and (fn := self._load(executor, found[0], job.device, key, record)):
            progress.update(loaded=1)
            self._finish(job, fn, record)
            return True
        return False

    def _load(
        self,
        executor: Executor,
        artifact: Artifact,
        device: torch.device,
        key: CacheKey,
        record: ModelRecord,
    ) -> CompiledRegion | None:
        """Load a stored artifact; None (and the entry dropped) if it is unusable."""
        start = time.perf_counter()
        try:
            if (artifact.executor, artifact.executor_version) != (executor.name, executor.version):
                raise CorruptArtifact(
                    f"artifact of {artifact.executor} under a {executor.name} key"
                )
            fn = executor.load(artifact, device)
        except CorruptArtifact as exc:
            log.warning("fcache: dropping unusable artifact %s: %s", key.digest, exc)
            self.cache.discard(key.digest)
            return None
        with record.lock:
            record.load_seconds += time.perf_counter() - start
        return fn

    # Misses --------------------------------------------------------------------------------

    def _compile(self, jobs: list[_Job], record: ModelRecord, progress: Progress) -> list[_Job]:
        """Compile the jobs' regions, in parallel when there are several. One thread per job
        waits on its single-flight lease, so a region that another process is compiling is
        loaded when it lands instead of compiled again. Returns the jobs whose executor
        failed; they go to their next executor."""
        if not jobs:
            return []
        failed = []
        with ThreadPoolExecutor(len(jobs), thread_name_prefix="fcache-lease") as threads:
            futures = {
                threads.submit(self._fetch_or_compile, job, record, len(jobs) > 1): job
                for job in jobs
            }
            for future in as_completed(futures):
                job = futures[future]
                try:
                    artifact, compiled = future.result()
                    fn = job.executor.load(artifact, job.device)
                except Exception as exc:  # a failed compile or load: the next executor
                    log.warning(
                        "fcache: %s could not compile a region of %d ops (%s); trying %s",
                        job.executor.name,
                        len(job.canon.nodes),
                        exc,
                        job.candidates[1].name,
                    )
                    job.candidates.pop(0)
                    failed.append(job)
                    continue
                self._finish(job, fn, record)
                progress.update(compiled=int(compiled), loaded=int(not compiled))
        return failed

    def _fetch_or_compile(
        self, job: _Job, record: ModelRecord, parallel: bool
    ) -> tuple[Artifact, bool]:
        """(artifact, whether this process compiled it). Runs on a lease thread."""
        key, executor = job.key, job.executor
        assert key is not None
        with self.cache.compile_lease(key.digest) as ready:
            if ready is not None and ready.executor == executor.name:
                return ready, False
            future = self.pool.submit(
                executor, job.canon, job.device, parallel=parallel and executor.compile_in_worker
            )
            artifact = _annotate(future.result(), key, job.canon)
            self.cache.put(key.digest, artifact)
        self.stats.add("local", compiles=1, compile_seconds=artifact.compile_seconds)
        with record.lock:
            record.compiles += 1
            record.compile_seconds += artifact.compile_seconds
        return artifact, True


def _annotate(artifact: Artifact, key: CacheKey, canon: CanonicalRegion) -> Artifact:
    """The key's components and the region travel with the artifact, for `fcache explain`."""
    meta = {f"key.{name}": value for name, value in key.components}
    meta["region"] = canon.text.decode()
    return dataclasses.replace(artifact, meta={**artifact.meta, **meta})


def _memo(key: CacheKey, device: torch.device) -> str:
    # Loaded callables are bound to a device; the key deliberately is not.
    return f"{key.digest}@{device}"


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
