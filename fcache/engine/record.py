"""ModelRecord: what compiling one model has cost so far, per process.

`fcache.jit` gives each model one record; every graph of the model (forward, backward,
each graph break) adds to it. `snapshot()` is what `fcache.stats(model)` returns.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fcache.stats import ModelStats


@dataclass
class ModelRecord:
    """Thread-safe through `lock` (lease threads record compiles while capture goes on)."""

    graphs: int = 0
    regions: int = 0
    keys: set[str] = field(default_factory=set)
    compiles: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0
    graph_seconds: float = 0.0
    programs_loaded: int = 0
    functions_loaded: int = 0
    dynamic_compiled: int = 0  # Dynamo graphs with symbolic sizes compiled by Inductor
    dynamic_loaded: int = 0  # ... whose compiled code came from a cache
    fallbacks: Counter[str] = field(default_factory=Counter)  # by reason
    validation_failures: Counter[str] = field(default_factory=Counter)  # by executor
    restrided_outputs: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    misses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # tiers that failed a look-up
    executors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __deepcopy__(self, memo: dict[int, Any]) -> ModelRecord:
        return type(self)()  # a copy of a compiled model (it runs in eager) counts afresh

    def __reduce__(self) -> tuple[type[ModelRecord], tuple[()]]:
        return type(self), ()

    def count(self, hits: Sequence[str] = (), misses: Sequence[str] = ()) -> None:
        with self.lock:
            self.hits.update(hits)
            self.misses.update(misses)

    def count_tiers(
        self, tiers: Sequence[str], hit: str | None, failed: Sequence[str] = ()
    ) -> None:
        """A hit in tier T means a miss in every tier above it; no hit, a miss in all;
        except in the tiers that `failed` (down, refused, skipped), which count errors."""
        above = list(tiers) if hit is None else list(tiers[: list(tiers).index(hit)])
        self.count(hits=(hit,) if hit else (), misses=[t for t in above if t not in failed])
        with self.lock:
            self.errors.update(failed)

    def snapshot(self) -> ModelStats:
        with self.lock:
            return ModelStats(
                graphs=self.graphs,
                regions=self.regions,
                unique_regions=len(self.keys),
                compiles=self.compiles,
                compile_seconds=self.compile_seconds,
                load_seconds=self.load_seconds,
                graph_seconds=self.graph_seconds,
                programs_loaded=self.programs_loaded,
                functions_loaded=self.functions_loaded,
                dynamic_compiled=self.dynamic_compiled,
                dynamic_loaded=self.dynamic_loaded,
                fallbacks=sum(self.fallbacks.values()),
                fallback_reasons=dict(self.fallbacks),
                validation_failures=dict(self.validation_failures),
                restrided_outputs=self.restrided_outputs,
                hits=dict(self.hits),
                misses=dict(self.misses),
                errors=dict(self.errors),
                executors=dict(self.executors),
            )
