"""The `fcache` command: stats, config, ls, gc, explain, demo.

    fcache stats [--json] [--server ADDR]   hits, misses, errors, bytes, compile time per tier
                                            (and FCACHE_REDIS's memory and policy)
    fcache stats --zero                     set the local cache's counters to zero
    fcache config [--json]                  every setting, where it came from; the signing key
    fcache ls [--json] [--limit N]          stored artifacts, most recently used first;
                                            read-only (listing marks nothing as used)
    fcache gc [--max-bytes SIZE | --all]    evict least recently used entries
    fcache explain KEY [KEY]                a key's components; for two keys, what differs
    fcache demo [--layers 2,8]              the built-in model, cold and warm, vs torch.compile

Settings come from FCACHE_* variables (fcache.config); `--dir` overrides FCACHE_DIR.
Bad input ends with one line on stderr and exit code 2, never a traceback. The tables
themselves are fcache.tables'.
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

from fcache import tables
from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.config import Settings, describe, parse_size
from fcache.errors import CorruptArtifact, FcacheError, NewerFormat
from fcache.protocol.limits import is_valid_key
from fcache.stats import DYNAMIC, EXECUTOR_PREFIX, FALLBACK_PREFIX, Counters
from fcache.tables import row, size
from fcache.version import __version__


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
        _emit(args, report, tables.server_table)
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
                if not name.startswith((EXECUTOR_PREFIX, FALLBACK_PREFIX)) and name != DYNAMIC
            },
            # Graphs with symbolic sizes compiled by Inductor (compiles) or loaded (hits).
            "dynamic": sources[DYNAMIC].to_dict() if DYNAMIC in sources else {},
            "executors": _by_prefix(sources, EXECUTOR_PREFIX),
            "fallbacks": {
                reason: c["fallbacks"] for reason, c in _by_prefix(sources, FALLBACK_PREFIX).items()
            },
        }
    if settings.redis:
        from fcache.cache.redis import report as redis_report

        report["redis"] = redis_report.describe(settings)
    _emit(args, report, tables.local_table)
    return 0


def _zeroed(report: dict[str, Any]) -> str:
    return f"statistics of {report['cache_dir']} set to zero"


def _by_prefix(sources: dict[str, Counters], prefix: str) -> dict[str, dict[str, float]]:
    return {n.removeprefix(prefix): c.to_dict() for n, c in sources.items() if n.startswith(prefix)}


# --- config -------------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace, settings: Settings) -> int:
    """Every setting, its value and where it came from, then the signing key by path and
    id (never its bytes; "made on first use" if the default key does not exist yet:
    looking writes nothing)."""
    from fcache.cache.signing import Signer, default_key_path

    environ = dict(os.environ)
    overrides = {}
    if args.dir:
        environ["FCACHE_DIR"], overrides["FCACHE_DIR"] = args.dir, "--dir"
    described = describe(environ, overrides)
    path = default_key_path(settings)
    key_id = Signer.from_file(path).key_id if path.exists() else None
    if args.json:
        rows = [dataclasses.asdict(d) for d in described]
        rows.append({
            "name": "signing key", "value": str(path), "id": key_id,
            "source": "file" if key_id else "made on first use",
            "meaning": "the key that signs and verifies (its id, never its bytes)",
        })  # fmt: skip
        print(json.dumps(rows, indent=2))
    else:
        print(tables.config_table(described))
        print(f"\nsigning key: {path} ({f'id {key_id}' if key_id else 'made on first use'})")
    return 0


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
    print(row("key", "size", "last used", "executor", "target", "compile", widths=(32, 9, 19)))
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_access"]))
        secs = f"{r['compile_seconds']:.1f}s" if r["compile_seconds"] is not None else "-"
        print(
            row(
                r["key"],
                size(r["bytes"]),
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
    print(f"evicted {evicted} entries, {size(before - after)}; {size(after)} remain")
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
        f"  compiled  in {artifact.compile_seconds:.2f}s, payload {size(len(artifact.payload))}",
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
    # peek, not get: looking at the cache must not mark its entries used, or listing
    # would reverse the order `fcache gc` evicts in.
    data = store.peek(key)
    if data is None:
        return None
    try:
        return decode(data)
    except (CorruptArtifact, NewerFormat):
        return None


def _emit(args: argparse.Namespace, report: dict[str, Any], table: Any) -> None:
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else table(report))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fcache", description="fcache: compile once, reuse everywhere."
    )
    parser.add_argument("--version", action="version", version=f"fcache {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    p = sub.add_parser("stats", help="hits, misses, bytes and compile time, per tier")
    p.add_argument("--json", action="store_true")
    p.add_argument("--server", help="ask an fcache-server (unix:/path or host:port) instead")
    p.add_argument("--dir", help="cache directory (default: FCACHE_DIR)")
    p.add_argument("--zero", action="store_true", help="set the persisted counters to zero")
    p.set_defaults(command=cmd_stats)

    p = sub.add_parser("config", help="every setting's value and where it came from")
    p.add_argument("--json", action="store_true")
    p.add_argument("--dir", help="cache directory (default: FCACHE_DIR)")
    p.set_defaults(command=cmd_config)

    p = sub.add_parser("ls", help="list stored artifacts (read-only)")
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
