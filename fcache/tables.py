"""What the `fcache` command prints: the tables of `fcache stats` (a local cache, a
server) and of `fcache config`, from the plain data their `--json` prints as it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fcache.config import Described
from fcache.stats import FALLBACK_REASONS, TIERS, Counters


def local_table(report: dict[str, Any]) -> str:
    lines = [
        f"cache      {report['cache_dir']}",
        f"entries    {report['entries']}",
        f"size       {size(report['bytes'])} of {size(report['max_bytes'])}",
        "",
        row("tier", "hits", "misses", "puts", "read", "written", "evicted", "corrupt",
            "errors", "saved"),
    ]  # fmt: skip
    total = Counters()
    failed = []
    for name in _ordered(report["tiers"]):
        c = Counters.from_dict(report["tiers"][name])
        total.add(c)
        if c.errors:
            failed.append(f"{name} {c.errors}")
        lines.append(
            row(name, c.hits, c.misses, c.puts, size(c.bytes_read), size(c.bytes_written),
                c.evictions, c.corrupt, c.errors, f"{c.compile_seconds_saved:.1f}s")
        )  # fmt: skip
    executors = sorted(report.get("executors", {}).items())
    for _, counters in executors:
        total.add(Counters.from_dict(counters))
    if failed:
        # Not misses: the tier did not answer (down, refused the token, unreadable), so
        # what it holds could not be used. A server that is down shows here.
        lines += ["", f"errors     {', '.join(failed)}: calls that failed (not misses)"]
    lines += [
        "",
        f"compiles   {total.compiles} ({total.compile_seconds:.1f}s spent), "
        f"lease grants {total.lease_grants}, lease waits {total.lease_waits}",
        f"saved      {total.compile_seconds_saved:.1f}s of compile time by cache hits",
        f"refused    {total.unverified} unverified (signature), {total.incompatible} of a "
        f"newer format; {total.stale_readers} stale reader slots freed",
    ]
    if executors:
        lines += ["", row("executor", "compiles", "seconds", "failed", "invalid", "restrided")]
        lines += [
            row(name, c["compiles"], f"{c['compile_seconds']:.1f}s", c["failures"],
                c["invalid"], c["restrided"])
            for name, c in executors
        ]  # fmt: skip
    if "redis" in report:
        from fcache.cache.redis import report as redis_report

        lines += ["", redis_report.line(report["redis"])]
    fallbacks = report.get("fallbacks", {})
    if fallbacks:
        why = ", ".join(f"{n} {FALLBACK_REASONS.get(r, r)}" for r, n in sorted(fallbacks.items()))
        lines += ["", f"fallbacks  {sum(fallbacks.values())} regions ran in eager: {why}"]
    if dynamic := report.get("dynamic"):
        c = Counters.from_dict(dynamic)
        lines += [
            "",
            f"dynamic    {c.compiles} graphs with symbolic sizes compiled by Inductor "
            f"({c.compile_seconds:.1f}s), {c.hits} loaded from a cache",
        ]
    return "\n".join(lines)


def server_table(report: dict[str, Any]) -> str:
    c = Counters.from_dict(report["counters"])
    uptime = float(report["uptime_seconds"])
    return "\n".join(
        [
            f"server     {report['address']} (fcache-server {report['server_version']})",
            f"upstream   {report['upstream'] or 'none'}",
            f"uptime     {uptime / 3600:.1f} h",
            f"entries    {report['entries']}",
            f"size       {size(report['bytes'])} of {size(report['max_bytes'])}",
            f"leases     {report['active_leases']} held, {report['waiting_callers']} waiting; "
            f"{c.lease_grants} granted, {c.lease_waits} waits so far",
            "",
            row("hits", "misses", "puts", "read", "written", "evicted", "corrupt", "rejected",
                "errors", "saved"),
            row(c.hits, c.misses, c.puts, size(c.bytes_read), size(c.bytes_written),
                c.evictions, c.corrupt, c.rejected, c.errors, f"{c.compile_seconds_saved:.1f}s"),
            "",
            f"trust      {c.unverified} unverified, {c.conflicts} conflicting and "
            f"{c.duplicates} duplicate puts; {c.overloaded} calls refused as overloaded",
            f"storage    {c.stale_readers} stale reader slots freed, {c.incompatible} "
            "entries of a newer format",
            *_server_tiers(report.get("tiers", {})),
        ]
    )  # fmt: skip


def _server_tiers(tiers: Mapping[str, Any]) -> list[str]:
    """The server's own tiers behind it (its Redis): what it read through and wrote back."""
    head = ["", row("tier", "hits", "misses", "puts", "read", "written", "corrupt", "errors")]
    return (head if tiers else []) + [
        row(name, c.hits, c.misses, c.puts, size(c.bytes_read), size(c.bytes_written),
            c.corrupt + c.unverified, c.errors)
        for name, c in ((n, Counters.from_dict(raw)) for n, raw in tiers.items())
    ]  # fmt: skip


def config_table(described: Sequence[Described]) -> str:
    """One line a variable, in the manner of `ccache -p`: (where from) NAME = value."""
    width = max(len(d.source) for d in described) + 2
    lines = [f"{'(' + d.source + ')':<{width}} {d.name} = {d.value}" for d in described]
    lines.append(
        "# fcache reads no settings file: FCACHE_* variables, else the defaults; "
        "fcache.jit(settings=...) overrides them per model (docs/settings.md)"
    )
    return "\n".join(lines)


def _ordered(tiers: Mapping[str, Any]) -> list[str]:
    return [t for t in TIERS if t in tiers] + sorted(t for t in tiers if t not in TIERS)


def row(*cells: object, widths: Sequence[int] = (8,)) -> str:
    padded = [str(c).ljust(widths[i] if i < len(widths) else 9) for i, c in enumerate(cells)]
    return " ".join(padded).rstrip()


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
