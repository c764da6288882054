"""One fcache process for the fault tests: compile a tiny function through fcache.jit with
the text executor (tests/text_executor.py), check it against eager, print a JSON summary.

    python -m tests.reliability.rank FUNC CACHE_DIR [--server ADDR] [--key FILE]
        [--token FILE] [--loaded LOG] [--keys-of FUNC] [--pause FILE] [--also FUNC]...
        [--executor text|inductor] [--verify 1|0]

Without --key, the process uses the default: the cache directory's own key, made on first
use (docs/trust.md). `--verify 0` is FCACHE_VERIFY=0; `--executor inductor` compiles with
Inductor instead of the text executor.

The text executor here logs the SHA-256 of every payload it loads to LOG, so a test can
tell exactly which artifacts' code this process ran. `--keys-of FUNC` also reports the
keys another function's regions get (as an attacker can compute them: by running the
same code) without touching CACHE_DIR or the server. `--also FUNC` (repeatable) then
compiles more functions with the same settings, in the same process (reported under
"also"), after waiting for the file `--pause` names to exist, if given: a test can do
something to the server between the first function and the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import torch

import fcache
from fcache.cache.artifact import Artifact, decode
from fcache.cache.lmdb import LmdbStore
from fcache.executors import registry
from tests.text_executor import TextExecutor

FUNCS = {
    "double": lambda x: (x * 2 + 1).cos(),
    "triple": lambda x: (x * 3 - 1).sin(),
    "square": lambda x: (x * x + 0.5).tanh(),
}


class LoggingTextExecutor(TextExecutor):
    log: Path | None = None

    def load(self, artifact: Artifact, device: torch.device):  # type: ignore[no-untyped-def]
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(hashlib.sha256(artifact.payload).hexdigest() + "\n")
        return super().load(artifact, device)


def _settings(cache_dir: Path, args: argparse.Namespace, server: bool) -> fcache.Settings:
    return fcache.Settings(
        cache_dir=cache_dir,
        server=args.server if server else None,
        token_file=Path(args.token) if args.token and server else None,
        signing_key_file=Path(args.key) if args.key else None,
        verify=args.verify == "1",
        executors=(args.executor,),
        compile_workers=1,
        server_timeout_s=5.0,
        progress=False,
    )


def run(func: str, settings: fcache.Settings) -> dict[str, object]:
    x = torch.linspace(-2.0, 2.0, 64)
    compiled = fcache.jit(FUNCS[func], settings=settings)
    out = compiled(x)
    stats = fcache.stats(compiled)
    store = LmdbStore(settings.cache_dir, settings.max_bytes)
    try:
        # Regions only: the stored program (a torch entry) is no code of an executor's.
        keys = [e.key for e in store.entries() if decode(store.get(e.key)).executor != "torch"]
        tiers = {tier: c.to_dict() for tier, c in store.read_stats().items()}
    finally:
        store.close()
    return {
        "correct": bool(torch.allclose(out, FUNCS[func](x))),
        "compiles": stats.compiles,
        "fallbacks": stats.fallbacks,
        "hits": dict(stats.hits),
        "misses": dict(stats.misses),
        "keys": keys,
        "tiers": tiers,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("func", choices=sorted(FUNCS))
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--server")
    parser.add_argument("--key")
    parser.add_argument("--token")
    parser.add_argument("--loaded", type=Path)
    parser.add_argument("--keys-of", choices=sorted(FUNCS))
    parser.add_argument("--also", choices=sorted(FUNCS), action="append", default=[])
    parser.add_argument("--pause", type=Path)
    parser.add_argument("--executor", choices=("text", "inductor"), default="text")
    parser.add_argument("--verify", choices=("1", "0"), default="1")
    args = parser.parse_args()
    LoggingTextExecutor.log = args.loaded
    registry.register("text", LoggingTextExecutor)
    report = run(args.func, _settings(args.cache_dir, args, server=True))
    if args.keys_of:
        with tempfile.TemporaryDirectory(prefix="fcache-keys-") as scratch:
            other = run(args.keys_of, _settings(Path(scratch), args, server=False))
        report["other_keys"] = other["keys"]
    if args.pause is not None:
        print("paused", flush=True)
        while not args.pause.exists():
            time.sleep(0.05)
    report["also"] = [run(f, _settings(args.cache_dir, args, server=True)) for f in args.also]
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
