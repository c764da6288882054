"""Jobs: the unique regions of one graph, each on its way to a callable.

Isomorphic regions (same canonical text, same device) become one job, so they are looked
up, compiled and loaded once; the job then serves every region it stands for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fcache.executors.base import CompiledRegion, Executor
from fcache.frontend.canonicalize import CanonicalRegion, NotCanonicalizable, canonicalize
from fcache.frontend.key import CacheKey, make_key
from fcache.frontend.partition import Region, has_library_op
from fcache.target import Target

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """One unique region of a graph. `candidates` are the executors still to try, in
    order, eager last; `key` is the key under `candidates[0]` once chosen."""

    canon: CanonicalRegion
    device: torch.device
    regions: list[Region]
    candidates: list[Executor]
    key: CacheKey | None = None
    fn: CompiledRegion | None = None
    # Toolchains by (executor, target), shared by the jobs of one graph: settings do not
    # change while a graph is compiled, and computing one hashes Inductor's whole config
    # (milliseconds, once per region of a warm start otherwise).
    toolchains: dict[tuple[str, Target], Mapping[str, str]] = field(default_factory=dict)
    first: str = field(init=False)  # the executor asked for first, to count fallbacks
    # Why it ends in eager, should it (a FALLBACK_REASONS key): the first executor that
    # failed on it says why; "unsupported" only where none failed, none taking it at all.
    reason: str = "unsupported"

    def __post_init__(self) -> None:
        self.first = self.candidates[0].name

    @property
    def layer(self) -> bool:
        """Whether it is a layer's region (matmuls inside): cut by op if no compiler
        takes it whole, rather than run in eager."""
        return has_library_op(self.regions[0])

    @property
    def executor(self) -> Executor:
        return self.candidates[0]

    def choose(self) -> CacheKey:
        """Skip executors that do not support the region; the key under the first that does."""
        target = Target.of(self.device)
        while not self.executor.supports(self.canon, target):
            self.next_executor("unsupported")  # eager supports everything, so this ends
        executor = self.executor
        toolchain = self.toolchains.get((executor.name, target))
        if toolchain is None:
            toolchain = self.toolchains[executor.name, target] = executor.toolchain(target)
        self.key = make_key(self.canon, target, executor.name, executor.version, toolchain)
        return self.key

    def next_executor(self, reason: str) -> None:
        """The current executor cannot have the region (a FALLBACK_REASONS key says why);
        the next one gets it. A failure's reason outlives the refusals after it (Inductor's
        failed compile must not be reported as nvFuser's "unsupported")."""
        self.candidates.pop(0)
        if self.reason == "unsupported":
            self.reason = reason

    @property
    def fell_back(self) -> bool:
        """Whether it ends in eager although a compiler was asked for."""
        return self.executor.name == "eager" and self.first != "eager"

    @property
    def memo(self) -> str:
        """The in-memory tier's key: loaded callables are bound to a device, keys are not."""
        assert self.key is not None
        return f"{self.key.digest}@{self.device}"


def canonical_forms(regions: Sequence[Region]) -> dict[Region, CanonicalRegion]:
    """The canonical form of every region that has one; the others run in eager."""
    forms = {}
    for region in regions:
        try:
            forms[region] = canonicalize(region)
        except NotCanonicalizable as exc:
            log.debug("region %d runs in eager: %s", region.index, exc)
    return forms


def make_jobs(
    canonical: Mapping[Region, CanonicalRegion],
    executors: Callable[[str], Sequence[Executor]],
) -> list[Job]:
    """One job per distinct (canonical form, device). `executors(device_type)` lists the
    executors to try on a device. Deterministic: jobs come in order of their first region."""
    by_text: dict[tuple[bytes, torch.device], Job] = {}
    toolchains: dict[tuple[str, Target], Mapping[str, str]] = {}
    for region, canon in canonical.items():
        job = by_text.get((canon.text, region.device))
        if job is None:
            candidates = list(executors(region.device.type))
            job = Job(canon, region.device, [], candidates, toolchains=toolchains)
            by_text[(canon.text, region.device)] = job
        job.regions.append(region)
    return list(by_text.values())
