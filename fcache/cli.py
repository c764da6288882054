"""The `fcache` command: stats, ls, gc, explain, demo.

    fcache stats [--json] [--server ADDR]   hits, misses, bytes, compile time spent and saved,
                                            per tier (and FCACHE_REDIS's memory and policy)
    fcache stats --zero                     set the local cache's counters to zero
    fcache ls [--json] [--limit N]          stored artifacts, most recently used first
    fcache gc [--max-bytes SIZE | --all]    evict least recently used entries
    fcache explain KEY [KEY]                a key's components; for two keys, what differs
    fcache demo [--layers 2,8]              the built-in model, cold and warm, vs torch.compile

Settings come from FCACHE_* variables (fcache.config); `--dir` overrides FCACHE_DIR.
Bad input ends with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.config import Settings, parse_size
from fcache.errors import CorruptArtifact, FcacheError, NewerFormat
from fcache.protocol.limits import is_valid_key
from fcache.stats import EXECUTOR_PREFIX, FALLBACK_PREFIX, FALLBACK_REASONS, TIERS, Counters


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # The command reports failures itself, once; library warnings would repeat them.
    logging.basicConfig(level=logging.ERROR, format="fcache: %(message)s")
    try:
        settings = Settings.from_env()
        if getattr(args, "dir", None):
            settings = settings.replace(cache_dir=Path(args.dir))
        return int(args.command(args, settings) or 0)
    except FcacheError as exc:
        print(f"fcache: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fcache ls | head`: the reader left; nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silences the flush at exit
        return 0


# --- stats --------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    if args.zero:
        if args.server:
            raise FcacheError("--zero applies to the local cache (a server's start at zero)")
        with _open_store(settings) as store:
            store.clear_stats()
        _emit(args, {"zeroed": True, "cache_dir": str(settings.cache_dir)}, _zeroed)
        return 0
    if args.server:
        from fcache.cache.remote import fetch_server_stats

        report: dict[str, Any] = fetch_server_stats(args.server, settings)
        _emit(args, report, _server_table)
        return 0
    with _open_store(settings) as store:
        sources = store.read_stats()
        report = {
            "cache_dir": str(settings.cache_dir),
            "entries": len(store.entries()),
            "bytes": store.total_bytes(),
            "max_bytes": settings.max_bytes,
            "tiers": {
                name: c.to_dict()
                for name, c in sources.items()
                if not name.startswith((EXECUTOR_PREFIX, FALLBACK_PREFIX))
            },
            "executors": _by_prefix(sources, EXECUTOR_PREFIX),
            "fallbacks": {
                reason: c["fallbacks"] for reason, c in _by_prefix(sources, FALLBACK_PREFIX).items()
            },
        }
    if settings.redis:
        from fcache.cache.redis import report as redis_report

        report["redis"] = redis_report.describe(settings)
    _emit(args, report, _local_table)
    return 0


def _zeroed(report: dict[str, Any]) -> str:
    return f"statistics of {report['cache_dir']} set to zero"


def _local_table(report: dict[str, Any]) -> str:
    lines = [
        f"cache      {report['cache_dir']}",
        f"entries    {report['entries']}",
        f"size       {_bytes(report['bytes'])} of {_bytes(report['max_bytes'])}",
        "",
        _row(
            "tier",
            "hits",
            "misses",
            "puts",
            "read",
            "written",
            "evicted",
            "corrupt",
            "errors",
            "saved",
        ),
    ]
    total = Counters()
    for name in _ordered(report["tiers"]):
        c = Counters.from_dict(report["tiers"][name])
        total.add(c)
        lines.append(
            _row(
                name,
                c.hits,
                c.misses,
                c.puts,
                _bytes(c.bytes_read),
                _bytes(c.bytes_written),
                c.evictions,
                c.corrupt,
                c.errors,
                f"{c.compile_seconds_saved:.1f}s",
            )
        )
    executors = sorted(report.get("executors", {}).items())
    for _, counters in executors:
        total.add(Counters.from_dict(counters))
    lines += [
        "",
        f"compiles   {total.compiles} ({total.compile_seconds:.1f}s spent), "
        f"lease grants {total.lease_grants}, lease waits {total.lease_waits}",
        f"saved      {total.compile_seconds_saved:.1f}s of compile time by cache hits",
        f"refused    {total.unverified} unverified (signature), {total.incompatible} of a "
        f"newer format; {total.stale_readers} stale reader slots freed",
    ]
    if executors:
        lines += ["", _row("executor", "compiles", "seconds", "failed", "invalid", "restrided")]
        lines += [
            _row(
                name,
                c["compiles"],
                f"{c['compile_seconds']:.1f}s",
                c["failures"],
                c["invalid"],
                c["restrided"],
            )
            for name, c in executors
        ]
    if "redis" in report:
        from fcache.cache.redis import report as redis_report

        lines += ["", redis_report.line(report["redis"])]
    fallbacks = report.get("fallbacks", {})
    if fallbacks:
        why = ", ".join(f"{n} {FALLBACK_REASONS.get(r, r)}" for r, n in sorted(fallbacks.items()))
        lines += ["", f"fallbacks  {sum(fallbacks.values())} regions ran in eager: {why}"]
    return "\n".join(lines)


def _by_prefix(sources: dict[str, Counters], prefix: str) -> dict[str, dict[str, float]]:
    return {n.removeprefix(prefix): c.to_dict() for n, c in sources.items() if n.startswith(prefix)}


def _server_table(report: dict[str, Any]) -> str:
    c = Counters.from_dict(report["counters"])
    uptime = float(report["uptime_seconds"])
    return "\n".join(
        [
            f"server     {report['address']} (fcache-server {report['server_version']})",
            f"upstream   {report['upstream'] or 'none'}",
            f"uptime     {uptime / 3600:.1f} h",
            f"entries    {report['entries']}",
            f"size       {_bytes(report['bytes'])} of {_bytes(report['max_bytes'])}",
            f"leases     {report['active_leases']} held, {report['waiting_callers']} waiting; "
            f"{c.lease_grants} granted, {c.lease_waits} waits so far",
            "",
            _row(
                "hits",
                "misses",
                "puts",
                "read",
                "written",
                "evicted",
                "corrupt",
                "rejected",
                "errors",
                "saved",
            ),
            _row(
                c.hits,
                c.misses,
                c.puts,
                _bytes(c.bytes_read),
                _bytes(c.bytes_written),
                c.evictions,
                c.corrupt,
                c.rejected,
                c.errors,
                f"{c.compile_seconds_saved:.1f}s",
            ),
            "",
            f"trust      {c.unverified} unverified, {c.conflicts} conflicting and "
            f"{c.duplicates} duplicate puts; {c.overloaded} calls refused as overloaded",
            *_server_tiers(report.get("tiers", {})),
        ]
    )


def _server_tiers(tiers: dict[str, Any]) -> list[str]:
    """The server's own tiers behind it (its Redis): what it read through and wrote back."""
    head = ["", _row("tier", "hits", "misses", "puts", "read", "written", "corrupt", "errors")]
    return (head if tiers else []) + [
        _row(name, c.hits, c.misses, c.puts, _bytes(c.bytes_read), _bytes(c.bytes_written),
             c.corrupt + c.unverified, c.errors)
        for name, c in ((n, Counters.from_dict(raw)) for n, raw in tiers.items())
    ]  # fmt: skip


# --- ls / gc ------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace, settings: Settings) -> int:
    with _open_store(settings) as store:
        entries = sorted(store.entries(), key=lambda e: e.last_access, reverse=True)[: args.limit]
        rows = []
        for entry in entries:
            artifact = _read(store, entry.key)
            rows.append(
                {
                    "key": entry.key,
                    "bytes": entry.size,
                    "last_access": entry.last_access,
                    "executor": artifact.executor if artifact else "(corrupt)",
                    "compile_seconds": artifact.compile_seconds if artifact else None,
                    "target": dict(artifact.key).get("target", "") if artifact else "",
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_row("key", "size", "last used", "executor", "target", "compile", widths=(32, 9, 19)))
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_access"]))
        secs = f"{r['compile_seconds']:.1f}s" if r["compile_seconds"] is not None else "-"
        print(
            _row(
                r["key"],
                _bytes(r["bytes"]),
                used,
                r["executor"],
                r["target"],
                secs,
                widths=(32, 9, 19),
            )
        )
    return 0


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    limit = (
        0
        if args.all
        else (parse_size("--max-bytes", args.max_bytes) if args.max_bytes else settings.max_bytes)
    )
    with _open_store(settings) as store:
        before = store.total_bytes()
        evicted = store.evict_to(limit)
        after = store.total_bytes()
    print(f"evicted {evicted} entries, {_bytes(before - after)}; {_bytes(after)} remain")
    return 0


# --- explain ------------------------------------------------------------------------------


def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    if len(args.keys) > 2:
        raise FcacheError(f"explain takes one or two keys, got {len(args.keys)}")
    for key in args.keys:
        if not is_valid_key(key):
            raise FcacheError(f"{key!r} is not a key (32 lowercase hex characters; see fcache ls)")
    with _open_store(settings) as store:
        artifacts = []
        for key in args.keys:
            artifact = _read(store, key)
            if artifact is None:
                raise FcacheError(f"no readable entry {key} in {settings.cache_dir}")
            artifacts.append(artifact)
    if len(artifacts) == 1:
        print(_describe(args.keys[0], artifacts[0]))
        return 0
    print(_compare(args.keys, artifacts))
    return 0


def _components(artifact: Artifact) -> dict[str, str]:
    return dict(artifact.key)


def _describe(key: str, artifact: Artifact) -> str:
    lines = [
        f"key {key}",
        f"  executor  {artifact.executor} {artifact.executor_version}",
        f"  compiled  in {artifact.compile_seconds:.2f}s, payload {_bytes(len(artifact.payload))}",
        "  components:",
    ]
    if artifact.refused:  # no code: the executor failed on this region, others skip it
        lines.insert(2, f"  refused   {artifact.refused} (the region runs elsewhere)")
    lines += [f"    {name:<20} {value}" for name, value in artifact.key]
    if artifact.region:
        doc = json.loads(artifact.region)
        ops = [n["op"] for n in doc["nodes"]]
        lines.append(
            f"  region    {len(doc['inputs'])} inputs, {len(ops)} ops, "
            f"{len(doc['outputs'])} outputs: {', '.join(ops[:12])}"
            + (" ..." if len(ops) > 12 else "")
        )
    return "\n".join(lines)


def _compare(keys: Sequence[str], artifacts: Sequence[Artifact]) -> str:
    a, b = (_components(x) for x in artifacts)
    differing = [n for n in dict.fromkeys([*a, *b]) if a.get(n) != b.get(n)]
    if not differing:
        return "the two keys have identical components (they are the same region)"
    lines = [f"{keys[0]} and {keys[1]} differ in: {', '.join(differing)}"]
    lines += [f"  {n}: {a.get(n, '(absent)')}  vs  {b.get(n, '(absent)')}" for n in differing]
    if "region" in differing:
        texts = [_pretty_region(x.region or "{}") for x in artifacts]
        lines.append("region diff:")
        lines += difflib.unified_diff(texts[0], texts[1], keys[0][:8], keys[1][:8], lineterm="")
    return "\n".join(lines)


def _pretty_region(text: str) -> list[str]:
    doc = json.loads(text)
    lines = [
        f"input {i}: {json.dumps(s, sort_keys=True)}" for i, s in enumerate(doc.get("inputs", []))
    ]
    lines += [
        f"%{j} = {n['op']}({json.dumps(n['args'])}, {json.dumps(n['kwargs'])})"
        for j, n in enumerate(doc.get("nodes", []))
    ]
    lines.append(f"outputs: {json.dumps(doc.get('outputs'))}")
    return lines


# --- demo ---------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from fcache.demo import DemoConfig, run_demo

    try:
        layers = tuple(int(x) for x in args.layers.split(","))
    except ValueError:
        raise FcacheError(f"--layers {args.layers!r}: expected numbers such as 2,8") from None
    if any(n < 1 for n in layers):
        raise FcacheError(f"--layers {args.layers!r}: every depth must be >= 1")
    cfg = DemoConfig(
        layers=layers,
        family=args.family,
        dim=args.dim,
        device=args.device,
        dtype=args.dtype,
        torch_compile=not args.no_torch_compile,
        executors=args.executors,
    )
    if args.demo_dir:
        cfg = dataclasses.replace(cfg, directory=Path(args.demo_dir))
    rows = run_demo(cfg)
    return 1 if any("error" in r for r in rows) else 0


# --- plumbing -----------------------------------------------------------------------------


class _open_store:
    """The local store for a command, with a clear error when there is none."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __enter__(self) -> LmdbStore:
        if not (self.settings.cache_dir / "lmdb.v1").exists():
            raise FcacheError(f"no fcache cache at {self.settings.cache_dir} (FCACHE_DIR)")
        self.store = LmdbStore(self.settings.cache_dir, self.settings.max_bytes)
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()


def _read(store: LmdbStore, key: str) -> Artifact | None:
    data = store.get(key)
    if data is None:
        return None
    try:
        return decode(data)
    except (CorruptArtifact, NewerFormat):
        return None


def _emit(args: argparse.Namespace, report: dict[str, Any], table: Any) -> None:
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else table(report))


def _ordered(tiers: dict[str, Any]) -> list[str]:
    return [t for t in TIERS if t in tiers] + sorted(t for t in tiers if t not in TIERS)


def _row(*cells: object, widths: Sequence[int] = (8,)) -> str:
    padded = [str(c).ljust(widths[i] if i < len(widths) else 9) for i, c in enumerate(cells)]
    return " ".join(padded).rstrip()


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fcache", description="fcache: compile once, reuse everywhere."
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    p = sub.add_parser("stats", help="hits, misses, bytes and compile time, per tier")
    p.add_argument("--json", action="store_true")
    p.add_argument("--server", help="ask an fcache-server (unix:/path or host:port) instead")
    p.add_argument("--dir", help="cache directory (default: FCACHE_DIR)")
    p.add_argument("--zero", action="store_true", help="set the persisted counters to zero")
    p.set_defaults(command=cmd_stats)

    p = sub.add_parser("ls", help="list stored artifacts")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--dir")
    p.set_defaults(command=cmd_ls)

    p = sub.add_parser("gc", help="evict least recently used entries")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--max-bytes", help="shrink to this size (default: FCACHE_MAX_BYTES)")
    group.add_argument("--all", action="store_true", help="remove every entry")
    p.add_argument("--dir")
    p.set_defaults(command=cmd_gc)

    p = sub.add_parser("explain", help="a key's components; for two keys, why they differ")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.add_argument("--dir")
    p.set_defaults(command=cmd_explain)

    p = sub.add_parser("demo", help="the built-in model cold and warm, next to torch.compile")
    p.add_argument("--layers", default="2", help="comma-separated depths (default 2)")
    p.add_argument("--family", choices=("llama", "gpt"), default="llama")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--executors", help="fcache executors to use, e.g. inductor,eager")
    p.add_argument("--no-torch-compile", action="store_true", help="skip the torch.compile rows")
    p.add_argument(
        "--dir",
        dest="demo_dir",
        help="where the demo keeps its caches (default ~/.cache/fcache-demo)",
    )
    p.set_defaults(command=cmd_demo)
    return parser


if __name__ == "__main__":
    sys.exit(main())
