"""Loading a 16-layer model's regions from Redis, from a node daemon and from local disk.

    python -m bench.bench_redis                  # the full run, saved under --out
    python -m bench.bench_redis --quick          # 2 layers, one round, not saved

One cold process compiles the built-in Llama-style model (fcache.examples.run, training
step, Inductor, CPU) into a local cache; every entry it stored (regions, the stored
program, the whole function) is then put, as the same bytes, on a fresh fcache-server
(`python -m service.main`, a Unix socket, its own LMDB) and in a fresh redis-server (a
Unix socket, allkeys-lru, no persistence). Then, per source:

- fetch: in a process of its own, every entry read through that source's client and
  decoded (checksum verified), one round after another: RedisStore (FCACHE_REDIS), the
  gRPC client RemoteStore (FCACHE_SERVER), LmdbStore (FCACHE_DIR; its pages are in the page
  cache after the first round, as a warm node's are). First round (connections opened)
  and median of the others.
- warm start: a fresh process with an empty Inductor cache and, for the daemon and Redis,
  an empty local cache: fcache.jit to the end of the first training step (start_s), and
  fcache's own time in it (graph_seconds: look-ups, loads); the sources take turns, round
  after round, so that the machine's drift touches all alike.

Results: a table on stdout, bench_redis.json and README.md in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.machine import machine, versions
from fcache.cache.artifact import decode
from fcache.cache.lmdb import LmdbStore
from fcache.stats import CacheStats

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("local", "daemon", "redis")


@contextmanager
def services(workdir: Path) -> Iterator[dict[str, str]]:
    """A fresh redis-server and fcache-server; their addresses as FCACHE_* take them."""
    redis_dir = workdir / "redis"
    redis_dir.mkdir()
    sock = redis_dir / "redis.sock"
    redis = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
         "--save", "", "--appendonly", "no", "--maxmemory", "2gb",
         "--maxmemory-policy", "allkeys-lru", "--dir", str(redis_dir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    ready = workdir / "ready.json"
    server = subprocess.Popen(
        [sys.executable, "-m", "service.main", "--db", str(workdir / "server-db"),
         "--listen", f"unix:{workdir / 'server.sock'}", "--ready-file", str(ready),
         "--log-level", "WARNING"],
        cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and sock.exists()):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("redis-server or fcache-server did not start")
            time.sleep(0.05)
        yield {
            "redis": f"unix://{sock}?db=0",
            "daemon": json.loads(ready.read_text())["addresses"][0],
        }
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        redis.terminate()
        redis.wait(30)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FCACHE_", "TORCHINDUCTOR"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    env["FCACHE_PROGRESS"] = "0"
    env.update(extra)
    return env


def run_model(layers: int, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process of fcache.examples.run: its JSON line."""
    done = subprocess.run(
        [sys.executable, "-m", "fcache.examples.run", "--system", "fcache", "--family", "llama",
         "--layers", str(layers), "--dim", "64", "--mode", "train", "--steps", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-4000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def fill(cache_dir: Path, addresses: dict[str, str]) -> tuple[list[str], int]:
    """Put every entry of the cold cache on the daemon and in Redis: (keys, bytes)."""
    from fcache.cache.redis import RedisStore
    from fcache.cache.remote import RemoteStore

    local = LmdbStore(cache_dir, 8 << 30)
    daemon = RemoteStore(addresses["daemon"], CacheStats(), timeout_s=120)
    redis = RedisStore(addresses["redis"], CacheStats(), timeout_s=120)
    keys, total = [], 0
    for entry in local.entries():
        data = local.get(entry.key)
        assert data is not None
        daemon.put(entry.key, data)
        redis.put(entry.key, data)
        keys.append(entry.key)
        total += len(data)
    for store in (local, daemon, redis):
        store.close()
    return keys, total


def fetch_child(source: str, address: str, keys: list[str], rounds: int) -> list[float]:
    """In this process: seconds to read and decode every key, per round."""
    if source == "local":
        store: Any = LmdbStore(Path(address), 8 << 30)
    elif source == "daemon":
        from fcache.cache.remote import RemoteStore

        store = RemoteStore(address, CacheStats(), timeout_s=120)
    else:
        from fcache.cache.redis import RedisStore

        store = RedisStore(address, CacheStats(), timeout_s=120)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for key in keys:
            data = store.get(key)
            assert data is not None, f"{source} lost {key}"
            decode(data)
        times.append(time.perf_counter() - start)
    store.close()
    return times


def fetch(source: str, address: str, keys: list[str], rounds: int, scratch: Path) -> list[float]:
    spec = scratch / f"fetch-{source}.json"
    spec.write_text(json.dumps({"source": source, "address": address, "keys": keys}))
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_redis", "--fetch-child", str(spec),
         "--rounds", str(rounds)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, one round, not saved")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="warm starts per source")
    parser.add_argument("--fetch-rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cpu-redis")
    parser.add_argument("--fetch-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fetch_child:
        spec = json.loads(args.fetch_child.read_text())
        times = fetch_child(spec["source"], spec["address"], spec["keys"], args.fetch_rounds)
        print(json.dumps(times))
        return
    layers = 2 if args.quick else args.layers
    rounds = 1 if args.quick else args.rounds
    fetch_rounds = 2 if args.quick else args.fetch_rounds
    scratch = Path(tempfile.mkdtemp(prefix="fcache-bench-redis-"))
    try:
        result = measure(layers, rounds, fetch_rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(table(result))
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_redis.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved {args.out / 'bench_redis.json'}")


def measure(layers: int, rounds: int, fetch_rounds: int, scratch: Path) -> dict[str, Any]:
    about = {"machine": {k: v for k, v in machine().items() if k != "hostname"}}
    about["versions"] = versions()
    cold_dir = scratch / "cold"
    cold = run_model(layers, _env(FCACHE_DIR=str(cold_dir), TORCHINDUCTOR_CACHE_DIR=str(
        scratch / "inductor-cold")))  # fmt: skip
    with _services(scratch) as addresses:
        keys, total = fill(cold_dir, addresses)
        sources = {"local": str(cold_dir), **addresses}
        fetches = {s: fetch(s, sources[s], keys, fetch_rounds, scratch) for s in SOURCES}
        starts: dict[str, list[dict[str, Any]]] = {s: [] for s in SOURCES}
        for r in range(rounds):
            for source in SOURCES:
                cache_dir = scratch / f"warm-{source}-{r}"
                if source == "local":
                    shutil.copytree(cold_dir, cache_dir)
                extra = {
                    "FCACHE_DIR": str(cache_dir),
                    "TORCHINDUCTOR_CACHE_DIR": str(scratch / f"inductor-{source}-{r}"),
                }
                if source == "daemon":
                    extra["FCACHE_SERVER"] = addresses["daemon"]
                if source == "redis":
                    extra["FCACHE_REDIS"] = addresses["redis"]
                starts[source].append(run_model(layers, _env(**extra)))  # fmt: skip
    return {
        **about,
        "layers": layers,
        "entries": len(keys),
        "entry_bytes": total,
        "cold": {k: cold[k] for k in ("start_s", "compiles", "unique_regions") if k in cold},
        "fetch_s": fetches,
        "warm": {
            s: [{k: run.get(k) for k in ("start_s", "compile_load_s", "compiles")} for run in runs]
            for s, runs in starts.items()
        },
    }


@contextmanager
def _services(scratch: Path) -> Iterator[dict[str, str]]:
    workdir = scratch / "services"
    workdir.mkdir()
    with services(workdir) as addresses:
        yield addresses


def table(result: dict[str, Any]) -> str:
    cold = result["cold"]
    lines = [
        f"{result['layers']} layers: {result['entries']} entries, "
        f"{result['entry_bytes'] / (1 << 20):.1f} MiB; cold start {cold['start_s']:.1f} s, "
        f"{cold['compiles']} compiles",
        "",
        "| source | fetch+verify all, first round | median of later rounds | warm start "
        "(median) | fcache's time in it | compiles |",
        "|---|---|---|---|---|---|",
    ]
    for source in SOURCES:
        times = result["fetch_s"][source]
        later = statistics.median(times[1:]) if len(times) > 1 else times[0]
        warm = result["warm"][source]
        start = statistics.median(r["start_s"] for r in warm)
        own = statistics.median(r["compile_load_s"] or 0.0 for r in warm)
        compiles = max(r["compiles"] for r in warm)
        lines.append(
            f"| {source} | {times[0] * 1000:.1f} ms | {later * 1000:.1f} ms | {start:.2f} s | "
            f"{own:.2f} s | {compiles} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
