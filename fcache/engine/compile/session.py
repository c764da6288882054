"""Session: the per-process compile service behind every model compiled with one Settings.

One graph goes through it as: partition, canonicalize and group into jobs, look each job
up (memory, then the byte tiers), compile the misses (single flight, in parallel), load,
and stitch. A Session owns the tiered cache (the in-memory tier of loaded regions
included) and the compile workers, so two models in a process, or the forward and
backward of one, share loaded kernels. `Session.get(settings)` returns the process's one
session for those settings (kept by `fcache.process`); `close()` releases its LMDB
environment, server channel, threads and worker processes.

Failure contract: nothing in here makes a model fail that eager would run. A region no
executor can compile runs in eager (counted as a fallback); a cache tier that fails is a
counted miss (the tiered cache's contract).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fcache import heap, process
from fcache.cache.artifact import Artifact, refusal
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.engine.compile.jobs import Job, canonical_forms, make_jobs
from fcache.engine.compile.later import later
from fcache.engine.compile.progress import Progress
from fcache.engine.compile.slots import Slot
from fcache.engine.compile.validate import Verdict, restrided, validate
from fcache.engine.compile.workers import CompilePool
from fcache.engine.programs.plan import Plan
from fcache.engine.record import ModelRecord
from fcache.engine.rewrite.stitch import stitch
from fcache.errors import CompileError, CompileInterrupted, CorruptArtifact
from fcache.executors import registry
from fcache.executors.base import CompiledRegion, Executor, whole_layers
from fcache.frontend import graph_text
from fcache.frontend.key import CacheKey
from fcache.frontend.partition import Partition, Region, cut_by_op, partition
from fcache.stats import CacheStats, executor_counters, fallback_counters

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stitched:
    """A compiled graph: the boxed callable, and the plan of its cut
    (fcache.engine.programs.plan)."""

    fn: Callable[[list[Any]], Any]
    plan: Plan


class Session:
    """Per-process compile service for one Settings. Thread-safe."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = CacheStats()
        self.cache = TieredCache.open(settings, self.stats)
        self.pool = CompilePool(settings.compile_workers, settings.compile_timeout_s)
        # Keys whose compile failed or did not validate in this process, and why: their
        # region goes straight to the next executor instead of failing the same way again.
        self._failed: dict[str, str] = {}

    @classmethod
    def get(cls, settings: Settings) -> Session:
        """The process's session for `settings`, made on first use."""
        return process.shared(("session", settings), lambda: cls(settings))

    def prestart(self, device: torch.device) -> None:
        """A cold start is coming (a program missed): start the compile workers for
        `device` now, while tracing goes on. GPUs only: there a worker's start-up (torch
        and Inductor imported, the CUDA context, a first compile) is 4.5-5 s on an H100
        host, as long as a small model's whole capture; on a CPU its start is an import,
        and spare cores are few."""
        if device.type != "cuda":
            return
        for executor in self._executors(device.type):
            if executor.persistent and executor.compile_in_worker:
                self.pool.prestart(executor, device)
                return

    def close(self) -> None:
        """Flush stats, close the cache tiers and stop the compile workers. Idempotent.
        Models compiled through this session keep the regions they have loaded."""
        process.forget(("session", self.settings), self)
        self.pool.close()
        self.cache.close()

    def compile_graph(
        self,
        graph: fx.Graph,
        owner: torch.nn.Module,
        example_inputs: Sequence[Any],
        label: str,
        *,
        record: ModelRecord,
        plan: Plan | None = None,
        wait: bool = True,
        returned: Collection[int] = (),
    ) -> Stitched:
        """An aten graph -> a boxed callable that runs it with compiled regions, and the
        plan of its cut. `owner` holds what the graph's get_attr nodes read. Given a plan
        (a warm process rebuilding a stored program), the graph is not partitioned or
        canonicalized again. Unless `wait` (and where there are compile workers), the
        regions are looked up and compiled on a thread of their own and the callable waits
        for them at its first call: a training step's forward regions compile while
        AOTAutograd traces and cuts the backward.
        `returned`: output positions handed to the model's caller as they are (stitch)."""
        start = time.perf_counter()
        if plan is None:
            parts = partition(graph, layers=self.by_layer(example_inputs))
            canonical = canonical_forms(parts.regions)
            fallbacks = {
                "partition": len(parts.declined),
                "no-canonical-form": len(parts.regions) - len(canonical),
            }
            plan = Plan.of(graph, parts, canonical, fallbacks)
        else:
            parts, canonical = plan.apply(graph)
        jobs = make_jobs(canonical, self._executors)
        if any(job.device.type == "cpu" for job in jobs):
            heap.keep_large_blocks()  # a warm CPU process steps as a compiling one (fcache.heap)
        for reason, regions in plan.fallbacks.items():
            self._fell_back(record, reason, regions)
        with record.lock:
            record.regions += len(canonical) + plan.fallbacks.get("no-canonical-form", 0)

        # Compiling in this process means tracing (make_fx, under Inductor too), and an FX
        # trace patches nn.Module.__call__ for the whole process while it runs: beside
        # Dynamo or AOTAutograd tracing in the caller's thread, that changes what they
        # trace (Dynamo's speculation diverged on T5). So a graph resolved on a thread of
        # its own asks worker processes for every compile, and without workers it is not
        # resolved aside at all.
        aside = not wait and self.pool.workers > 1

        def resolve() -> Callable[[list[Any]], Any]:
            progress = Progress(f"{label} graph", len(jobs), self.settings.progress)
            self._settle(jobs, record, progress, aside)
            # A layer no compiler took whole is cut by op, and those regions resolved.
            cut, compiled = self._cut_by_op(parts, jobs, record, progress, aside)
            progress.close()
            log.debug("fcache: %s: %d jobs in %.2fs", label, len(jobs), time.perf_counter() - start)
            self.cache.flush_stats()
            compiled.update({r: job.fn for job in jobs for r in job.regions if job.fn})
            fn = stitch(cut, compiled, owner, returned)
            with record.lock:
                record.graphs += 1
            return fn

        def spent(seconds: float) -> None:  # the caller's wall time in fcache, waits included
            with record.lock:
                record.graph_seconds += seconds

        fn = later(resolve, label, spent) if aside else resolve()
        spent(time.perf_counter() - start)
        return Stitched(fn, plan)

    def _settle(
        self, jobs: list[Job], record: ModelRecord, progress: Progress, aside: bool
    ) -> None:
        """Give every job a callable: looked up, or compiled; each round, a job gets one
        or moves to its next executor (eager, last, takes any)."""
        pending = jobs
        while pending:
            misses = [job for job in pending if not self._lookup(job, record, progress)]
            pending = self._compile(misses, record, progress, aside)

    def _cut_by_op(
        self,
        parts: Partition,
        jobs: list[Job],
        record: ModelRecord,
        progress: Progress,
        aside: bool,
    ) -> tuple[Partition, dict[Region, CompiledRegion]]:
        """`parts` with each layer's region that ended in eager (no compiler took it whole)
        replaced by its cut by op, whose regions are resolved here: a layer Inductor
        cannot compile still runs its fused pieces compiled. Deterministic, so that a warm
        process (the layer's refusal stored) cuts it the same way and finds the pieces."""
        layered = {r for job in jobs if job.layer and job.fell_back for r in job.regions}
        if not layered:
            return parts, {}
        for job in jobs:
            if job.layer and job.fell_back:
                log.warning(
                    "fcache: a layer's region of %d ops runs cut by op (%s whole: %s)",
                    len(job.canon.nodes), job.first, job.reason,
                )  # fmt: skip
        # A graph rebuilt from a stored program's text has no values on its nodes, and a
        # cut goes by them (`is_fusible`): without them every op ran alone in eager.
        for graph in {node.graph for region in layered for node in region.nodes}:
            graph_text.with_values(graph)
        steps: list[fx.Node | Region] = []
        pieces: list[Region] = []
        for step in parts.steps:
            if step in layered:
                cut = cut_by_op(step, len(parts.regions) + len(pieces))
                pieces += cut.regions
                steps += cut.steps
            else:
                steps.append(step)
        canonical = canonical_forms(pieces)
        self._fell_back(record, "no-canonical-form", len(pieces) - len(canonical))
        with record.lock:
            record.regions += len(pieces) - len(layered)
        more = make_jobs(canonical, self._executors)
        progress.add(len(more))
        self._settle(more, record, progress, aside)
        compiled = {r: job.fn for job in more for r in job.regions if job.fn}
        return Partition(tuple(steps), parts.declined), compiled

    def by_layer(self, example_inputs: Sequence[Any]) -> bool:
        """Whether a graph on these inputs' device is cut by layer: asked (FCACHE_REGIONS)
        and taken whole by the first executor there (nvFuser first: by op)."""
        if self.settings.regions != "layers":
            return False
        tensor = next((x for x in example_inputs if isinstance(x, torch.Tensor)), None)
        first = self._executors(tensor.device.type if tensor is not None else "cpu")
        return not first or whole_layers(first[0])

    def _executors(self, device_type: str) -> tuple[Executor, ...]:
        return registry.resolve(self.settings.executors, device_type)

    def _finish(self, job: Job, fn: CompiledRegion, record: ModelRecord) -> None:
        assert job.key is not None
        job.fn = fn
        self.cache.memory.put(job.memo, fn)
        if job.fell_back and job.layer:  # cut by op instead (_cut_by_op): its pieces count
            return
        with record.lock:
            record.keys.add(job.key.digest)
            record.executors[job.executor.name] += 1
        if job.fell_back:
            self._fell_back(record, job.reason, len(job.regions))

    def _fell_back(self, record: ModelRecord, reason: str, regions: int) -> None:
        if regions:
            self.stats.add(fallback_counters(reason), fallbacks=regions)
            with record.lock:
                record.fallbacks[reason] += regions

    # Hits ----------------------------------------------------------------------------------

    def _lookup(self, job: Job, record: ModelRecord, progress: Progress) -> bool:
        """Find a callable for the job without compiling; False if it must be compiled.
        Executors that refused the region (in this process, or a refusal in the cache) are
        skipped on the way."""
        while True:
            key = job.choose()
            if key.digest in self._failed:
                job.next_executor(self._failed[key.digest])
                continue
            executor = job.executor
            if (fn := self.cache.memory.get(job.memo)) is not None:
                record.count(hits=("memory",))
                progress.update(reused=1)
                self._finish(job, fn, record)  # type: ignore[arg-type]
                return True
            record.count(misses=("memory",))
            if not executor.persistent:  # cheaper to build than to store: never cached
                fn = executor.load(executor.compile(job.canon, job.device), job.device)
                self._finish(job, fn, record)
                return True
            found, failed = self.cache.lookup(key.digest)
            record.count_tiers(self.cache.tiers, found[1] if found else None, failed)
            if found is None:
                return False
            if reason := found[0].refused:
                self._failed[key.digest] = reason
                job.next_executor(reason)
                continue
            if (fn := self._load(executor, found[0], job.device, key, record)) is None:
                return False
            progress.update(loaded=1)
            self._finish(job, fn, record)
            return True

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
            fn = restrided(executor.load(artifact, device), artifact.restride)
        except CorruptArtifact as exc:
            log.warning("fcache: dropping unusable artifact %s: %s", key.digest, exc)
            self.cache.discard(key.digest)
            return None
        with record.lock:
            record.load_seconds += time.perf_counter() - start
            record.restrided_outputs += len(artifact.restride)
        return fn

    # Misses --------------------------------------------------------------------------------

    def _compile(
        self, jobs: list[Job], record: ModelRecord, progress: Progress, aside: bool = False
    ) -> list[Job]:
        """Compile, validate and load the jobs' regions, in parallel when there are several
        or when the caller resolves its graph `aside` (in worker processes: see there).
        One thread per job waits on its single-flight lease, so a region that another
        process is compiling is loaded when it lands instead of compiled again. Returns the
        jobs whose executor failed; they go to their next executor."""
        if not jobs:
            return []
        progress.compiling()
        parallel = aside or len(jobs) > 1
        failed = []

        def settle(job: Job, outcome: tuple[CompiledRegion, bool] | Exception) -> None:
            if isinstance(outcome, Exception):  # a failed compile, load or validation
                reason = _reason(outcome)
                log.warning(
                    "fcache: %s could not compile a region of %d ops (%s); trying %s",
                    job.executor.name,
                    len(job.canon.nodes),
                    outcome,
                    job.candidates[1].name,
                )
                log.debug("fcache: the failure's traceback", exc_info=outcome)
                if not isinstance(outcome, Invalid | Refused):
                    self.stats.add(executor_counters(job.executor.name), failures=1)
                assert job.key is not None
                self._failed[job.key.digest] = reason
                job.next_executor(reason)
                failed.append(job)
                return
            fn, compiled = outcome
            self._finish(job, fn, record)
            progress.update(compiled=int(compiled), loaded=int(not compiled))

        # Every job takes its place in line for a compile slot before any lease thread
        # starts, the largest first: which thread gets going first must not decide which
        # region a free worker compiles first (the largest is the cold start's longest).
        jobs = sorted(jobs, key=lambda job: -len(job.canon.nodes))
        slots = [
            self.pool.slot(len(j.canon.nodes), parallel=parallel and j.executor.compile_in_worker)
            for j in jobs
        ]
        try:
            threads = ThreadPoolExecutor(len(jobs), thread_name_prefix="fcache-lease")
            futures = {
                threads.submit(self._fetch_or_compile, job, record, parallel, slot): job
                for job, slot in zip(jobs, slots, strict=True)
            }
        except RuntimeError:  # the interpreter is exiting (no new threads): one by one, here
            for job, slot in zip(jobs, slots, strict=True):
                settle(job, _outcome(self._fetch_or_compile, job, record, parallel, slot))
        else:
            with threads:
                for future in as_completed(futures):
                    settle(futures[future], _outcome(future.result))
        return failed

    def _fetch_or_compile(
        self, job: Job, record: ModelRecord, parallel: bool, slot: Slot
    ) -> tuple[CompiledRegion, bool]:
        """(callable, whether this process compiled it). Runs on a lease thread. A region
        compiled here is validated against eager before it is stored
        (fcache.engine.compile.validate); one another process stored was validated there.
        The lease is asked for once `slot` (a place in line) holds a compile slot, and a
        wait for another process's compile gives it back (fcache.engine.compile.slots):
        ranks that miss together split the regions."""
        try:
            return self._lease_and_compile(job, record, parallel, slot.wait())
        finally:
            slot.release()

    def _lease_and_compile(
        self, job: Job, record: ModelRecord, parallel: bool, slot: Slot
    ) -> tuple[CompiledRegion, bool]:
        key, executor = job.key, job.executor
        assert key is not None
        with self.cache.compile_lease(key.digest, waiting=slot.release) as ready:
            if ready is not None and ready.refused:
                raise Refused(ready.refused)
            if ready is not None and ready.executor == executor.name:
                slot.release()
                return restrided(executor.load(ready, job.device), ready.restride), False
            try:
                fn, artifact, verdict = self._build(job, record, parallel, slot)
            except Exception as exc:
                if not isinstance(exc, CompileInterrupted | torch.OutOfMemoryError):
                    # Remembered by every process that shares the cache: none compiles the
                    # region with this executor again (the key names its version).
                    refused = dataclasses.replace(
                        refusal(executor.name, executor.version, _reason(exc)),
                        key=key.components,
                        region=job.canon.text.decode(),
                    )
                    self.cache.put(key.digest, refused)
                raise
            artifact = dataclasses.replace(
                artifact,
                key=key.components,
                region=job.canon.text.decode(),
                restride=verdict.restride,
            )
            self.cache.put(key.digest, artifact)
        with record.lock:
            record.restrided_outputs += len(verdict.restride)
        return restrided(fn, verdict.restride), True

    def _build(
        self, job: Job, record: ModelRecord, parallel: bool, slot: Slot
    ) -> tuple[CompiledRegion, Artifact, Verdict]:
        """Compile the job's region with its executor, load it and validate it against
        eager: (callable, artifact, verdict). Raises Invalid if the results differ. The
        slot goes back once the compile returns: loading and validating run here."""
        executor = job.executor
        start = time.perf_counter()
        future = self.pool.submit(
            executor, job.canon, job.device, parallel=parallel and executor.compile_in_worker
        )
        try:
            artifact = future.result()
        finally:
            slot.release()
        compiled = time.perf_counter()
        fn = executor.load(artifact, job.device)
        loaded = time.perf_counter()
        verdict = validate(job.canon, fn, job.device)
        log.debug(
            "fcache: %s region of %d ops: compiled in %.2fs (%.2fs waiting and compiling), "
            "loaded in %.2fs, validated in %.2fs",
            executor.name,
            len(job.canon.nodes),
            artifact.compile_seconds,
            compiled - start,
            loaded - compiled,
            time.perf_counter() - loaded,
        )
        counters = executor_counters(executor.name)
        self.stats.add(counters, compiles=1, compile_seconds=artifact.compile_seconds)
        with record.lock:
            record.compiles += 1
            record.compile_seconds += artifact.compile_seconds
        if not verdict.ok:
            self.stats.add(counters, invalid=1)
            with record.lock:
                record.validation_failures[executor.name] += 1
            raise Invalid(f"validation against eager failed: {verdict.reason}")
        unchecked = int(not verdict.checked)
        self.stats.add(counters, restrided=len(verdict.restride), unchecked=unchecked)
        return fn, artifact, verdict


def _outcome(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)`, or the exception it raised."""
    try:
        return call(*args)
    except Exception as exc:
        return exc


class Invalid(CompileError):
    """A compiled region's results do not match eager's: not stored, never used."""


class Refused(CompileError):
    """The cache holds a refusal for the key: the executor failed on the region before."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"refused earlier: {reason}")
        self.reason = reason


def _reason(exc: BaseException) -> str:
    """The fallback reason (a fcache.stats.FALLBACK_REASONS key) of a failed compile."""
    if isinstance(exc, Refused):
        return exc.reason
    return "validation-failed" if isinstance(exc, Invalid) else "compile-failed"
