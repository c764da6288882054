"""Counters of cache activity, one vocabulary for stores, the server, the CLI and models.

`Counters` is a flat record of what one tier (or one server, or one executor) did.
`CacheStats` holds one `Counters` per source: the tiers ("memory", "local", "remote",
"redis") and
the executors ("executor:inductor", ...: compiles and what went wrong with them), and is
safe to update from many threads. The same field names appear in `fcache stats`, its
`--json`, the server's Stats RPC and `fcache.stats(model)`, so a number can be followed
from one to the other.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

TIERS = ("memory", "local", "remote", "redis")
EXECUTOR_PREFIX = "executor:"
# Graphs with symbolic sizes compiled whole by Inductor (compiles) or loaded (hits):
# fcache.engine.dynamic.
DYNAMIC = "dynamic"
FALLBACK_PREFIX = "fallback:"
# Why a region runs in eager although a compiler was asked for.
FALLBACK_REASONS = {
    "partition": "declined by partition (the run spans devices)",
    "no-canonical-form": "no canonical form (a symbolic shape, an unknown argument)",
    "unsupported": "no executor supports it",
    "compile-failed": "compile failed",
    "validation-failed": "validation failed (results unlike eager's)",
}


def executor_counters(name: str) -> str:
    """The CacheStats source name of an executor's compiles."""
    return EXECUTOR_PREFIX + name


def fallback_counters(reason: str) -> str:
    """The CacheStats source name of fallbacks for one reason (a FALLBACK_REASONS key)."""
    return FALLBACK_PREFIX + reason


@dataclass(slots=True)
class Counters:
    """What one tier did. All counts are monotonic; add deltas with `add`."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    evictions: int = 0
    # Entries that failed verification when read (and were dropped).
    corrupt: int = 0
    # Uploads refused by a server: bad checksum, size or key, or not authorized.
    rejected: int = 0
    # The tier could not be reached, read or written.
    errors: int = 0
    lease_grants: int = 0
    lease_waits: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    # Sum of the recorded compile time of every artifact this tier served.
    compile_seconds_saved: float = 0.0
    # Executors: compiles that raised; compiled regions whose results did not match eager's
    # (not stored); outputs copied into eager's layout; regions too large to validate.
    failures: int = 0
    invalid: int = 0
    restrided: int = 0
    unchecked: int = 0
    # Regions run in eager although a compiler was asked for (source "fallback:REASON").
    fallbacks: int = 0
    # Trust (fcache.cache.signing): entries refused because their signature is missing,
    # made with another key or does not match (never loaded, never copied up a tier).
    unverified: int = 0
    # Puts refused because other contents are stored under the key (an alert: two
    # producers disagree, or one forges); puts of what is stored already.
    conflicts: int = 0
    duplicates: int = 0
    # Entries in a newer envelope format than this fcache reads: misses, left in place.
    incompatible: int = 0
    # Storage health: reader slots of dead processes freed; calls refused because the
    # server was at its bound of concurrent calls or in-flight bytes.
    stale_readers: int = 0
    overloaded: int = 0
    # Entries a server dropped because a reader reported it refused them (its signature).
    reported: int = 0

    def add(self, other: Counters) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> Counters:
        """Unknown names are ignored, so newer writers do not break older readers."""
        known = {f.name: f.type for f in dataclasses.fields(cls)}
        kw = {
            k: (float(v) if known[k] == "float" else int(v)) for k, v in data.items() if k in known
        }
        return cls(**kw)  # type: ignore[arg-type]

    def is_zero(self) -> bool:
        return not any(self.to_dict().values())


class CacheStats:
    """Counters by tier. Thread-safe: every method takes one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tiers: dict[str, Counters] = {}

    def add(self, tier: str, **deltas: float) -> None:
        """Add to named counters of a tier, e.g. `add("local", hits=1, bytes_read=n)`."""
        with self._lock:
            counters = self._tiers.setdefault(tier, Counters())
            for name, value in deltas.items():
                setattr(counters, name, getattr(counters, name) + value)

    def tier(self, name: str) -> Counters:
        with self._lock:
            return dataclasses.replace(self._tiers.get(name, Counters()))

    def snapshot(self) -> dict[str, Counters]:
        with self._lock:
            return {k: dataclasses.replace(v) for k, v in self._tiers.items()}

    def total(self) -> Counters:
        total = Counters()
        for counters in self.snapshot().values():
            total.add(counters)
        return total


@dataclass(frozen=True, slots=True)
class ModelStats:
    """What compiling one model cost, returned by `fcache.stats(model)`.

    `regions` counts region instances in every captured graph; `unique_regions` counts
    distinct cache keys among them. `hits` and `misses` are per tier; a region found in
    memory is never looked up in the local store, and so on down. `errors`: look-ups a
    tier did not answer (a server down, a token it refuses, a disk that failed), per
    tier; those are not misses. `str()` gives a
    labelled summary (what `print(fcache.stats(model))` shows); `to_dict()` the numbers.
    """

    graphs: int = 0
    regions: int = 0
    unique_regions: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0
    # Wall time inside fcache's per-graph work (partition, keys, look-ups, compiles, loads),
    # of every graph: what fcache added to the first step beyond tracing. A forward whose
    # regions compile while the backward is traced counts what its caller waited for them.
    graph_seconds: float = 0.0
    # Graphs rebuilt from a stored program (AOTAutograd and partitioning skipped).
    programs_loaded: int = 0
    # Whole functions loaded (fcache.engine.whole.route: Dynamo skipped too).
    functions_loaded: int = 0
    # Dynamo graphs with symbolic sizes (fcache.engine.dynamic), compiled whole by Inductor
    # in this process, or loaded from a cache (Inductor's, or fcache's tiers).
    dynamic_compiled: int = 0
    dynamic_loaded: int = 0
    # Regions that run in eager although a compiler was asked for, and why (by the keys of
    # FALLBACK_REASONS).
    fallbacks: int = 0
    fallback_reasons: Mapping[str, int] = field(default_factory=dict)
    # Compiled regions whose results did not match eager's, by executor.
    validation_failures: Mapping[str, int] = field(default_factory=dict)
    # Region outputs an executor laid out otherwise, copied into eager's layout per call.
    restrided_outputs: int = 0
    hits: Mapping[str, int] = field(default_factory=dict)
    misses: Mapping[str, int] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)
    executors: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            f.name: (dict(v) if isinstance(v := getattr(self, f.name), Mapping) else v)
            for f in dataclasses.fields(self)
        }

    def __str__(self) -> str:
        """A labelled, rounded summary, in the manner of `ccache -s`."""
        unique = self.unique_regions
        loaded = sum(n for tier, n in self.hits.items() if tier != "memory")
        rows = [
            ("Graphs captured", f"{self.graphs}"),
            ("Regions", f"{self.regions} ({unique} unique)"),
            ("  compiled", f"{_of(self.compiles, unique)} in {_seconds(self.compile_seconds)}"),
            ("  loaded from a cache", f"{_of(loaded, unique)} in {_seconds(self.load_seconds)}"),
            ("  found in memory", _of(self.hits.get("memory", 0), unique)),
        ]
        if self.functions_loaded:
            rows.append(("Stored functions loaded", f"{self.functions_loaded} (no Dynamo)"))
        if self.dynamic_compiled or self.dynamic_loaded:
            rows.append(
                (
                    "Dynamic graphs",
                    f"{self.dynamic_compiled} compiled, {self.dynamic_loaded} loaded (Inductor)",
                )
            )
        rows.append(("Run in eager", f"{self.fallbacks} regions{_reasons(self.fallback_reasons)}"))
        seen = set(self.hits) | set(self.misses) | set(self.errors)
        for tier in [t for t in TIERS if t in seen] + sorted(seen - set(TIERS)):
            hits, misses = self.hits.get(tier, 0), self.misses.get(tier, 0)
            failed = f", {n} errors (the tier failed)" if (n := self.errors.get(tier)) else ""
            rows.append((f"Look-ups, {tier}", f"{hits} hits, {misses} misses{failed}"))
        if self.executors:
            used = ", ".join(f"{name} {n}" for name, n in sorted(self.executors.items()))
            rows.append(("Executors (unique regions)", used))
        if self.validation_failures:
            failed = ", ".join(f"{n} {e}" for e, n in sorted(self.validation_failures.items()))
            rows.append(("Failed validation", failed))
        if self.restrided_outputs:
            rows.append(("Outputs copied to eager's strides", f"{self.restrided_outputs}"))
        rows.append(("Time in fcache", _seconds(self.graph_seconds)))
        width = max(len(label) for label, _ in rows) + 2
        return "\n".join(f"{label + ':':<{width}}{value}" for label, value in rows)


def _of(part: int, whole: int) -> str:
    share = f" ({100 * part / whole:.0f}%)" if whole else ""
    return f"{part} / {whole}{share}"


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _reasons(reasons: Mapping[str, int]) -> str:
    if not reasons:
        return ""
    return " (" + ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())) + ")"
