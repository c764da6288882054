"""One fcache process of the Redis tests: compile a tiny function with fcache.jit through
a node server (`--server`) or straight against a Redis (`--redis`), with the text executor
(tests/text_executor.py), check it against eager, print a JSON summary as the last line.

    python -m tests.redis.node FUNC CACHE_DIR [--server ADDR] [--redis URL] [--key FILE]
        [--compile-delay S] [--compiling FILE] [--timeout S] [--lease-ttl S]

Without `--key`, the processes of one test share one key (`cluster.key` beside their
cache directories), as a cluster's nodes do. `--compile-delay` makes each compile take
that long (so that processes started together overlap in their compiles); `--compiling
FILE` appends a line to FILE when a compile starts, before the delay (a test waits for
it to kill the process mid-compile). The summary holds the persisted counters of every
tier (what `fcache stats` shows) and the keys of the regions stored locally.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import fcache
from fcache import process
from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.cache.signing import load_or_create
from fcache.executors import registry
from fcache.frontend.canonicalize import CanonicalRegion
from tests.text_executor import TextExecutor

FUNCS = {
    "double": lambda x: ((x * 2 + 1).cos() @ x.t()).sin() * 3,
    "triple": lambda x: ((x * 3 - 1).sin() @ x.t()).cos() * 2,
}


class SlowTextExecutor(TextExecutor):
    delay_s = 0.0
    compiling: Path | None = None

    def compile(self, region: CanonicalRegion, device: torch.device) -> Artifact:
        if self.compiling is not None:
            with self.compiling.open("a") as f:
                f.write("compiling\n")
        time.sleep(self.delay_s)
        return super().compile(region, device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("func", choices=sorted(FUNCS))
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--server")
    parser.add_argument("--redis")
    parser.add_argument("--key", type=Path)
    parser.add_argument("--compile-delay", type=float, default=0.0)
    parser.add_argument("--compiling", type=Path)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    args = parser.parse_args()
    SlowTextExecutor.delay_s = args.compile_delay
    SlowTextExecutor.compiling = args.compiling
    registry.register("text", SlowTextExecutor)
    # The processes of one test are one cluster: without --key they share the key of the
    # test's directory (made by the first), as the nodes of a cluster share one key file.
    key = args.key
    if key is None:
        key = args.cache_dir.parent / "cluster.key"
        load_or_create(key)
    settings = fcache.Settings(
        cache_dir=args.cache_dir,
        server=args.server,
        redis=args.redis,
        signing_key_file=key,
        executors=("text",),
        compile_workers=1,
        server_timeout_s=args.timeout,
        redis_timeout_s=args.timeout,
        redis_lease_ttl_s=args.lease_ttl,
        progress=False,
    )
    x = torch.linspace(-2.0, 2.0, 64).reshape(8, 8)
    start = time.monotonic()
    compiled = fcache.jit(FUNCS[args.func], settings=settings)
    out = compiled(x)
    seconds = time.monotonic() - start
    stats = fcache.stats(compiled)
    process.reset()  # flushes the counters to the local store and closes it
    store = LmdbStore(settings.cache_dir, settings.max_bytes)
    try:
        keys = [e.key for e in store.entries() if decode(store.get(e.key)).executor == "text"]
        tiers = {tier: c.to_dict() for tier, c in store.read_stats().items()}
    finally:
        store.close()
    report = {
        "correct": bool(torch.allclose(out, FUNCS[args.func](x))),
        "compiles": stats.compiles,
        "unique_regions": stats.unique_regions,
        "hits": dict(stats.hits),
        "misses": dict(stats.misses),
        "keys": sorted(keys),
        "tiers": tiers,
        "seconds": round(seconds, 3),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
