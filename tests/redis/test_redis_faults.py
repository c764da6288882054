"""Redis down, hung, killed and restarted under fcache processes that use it directly
(FCACHE_REDIS, no node daemon): fcache keeps working from its local tier, counts the
errors, warns once, loses nothing it stored locally, and uses Redis again once it is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fcache.cache.artifact import Artifact
from fcache.cache.lmdb import LmdbStore
from fcache.cache.redis import RedisStore
from fcache.cache.remote import CircuitBreaker
from fcache.cache.tiered import TieredCache
from fcache.stats import CacheStats
from tests import fresh
from tests.redis.support import RedisServer
from tests.service.support import ROOT

WARNING = "while it fails, a warning every"


def _run(func: str, cache_dir: Path, *args: str) -> tuple[dict[str, Any], str]:
    done = fresh.run(
        [sys.executable, "-m", "tests.redis.node", func, str(cache_dir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _stats(cache_dir: Path, redis: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["FCACHE_REDIS"] = redis
    return subprocess.run(
        [sys.executable, "-m", "fcache.cli", "stats", "--dir", str(cache_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def _row(table: str, tier: str) -> dict[str, str]:
    """The tier's row of the per-tier table, by column (cells are padded to fixed widths
    and may hold spaces: "1.2 KiB")."""
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("tier "))
    row = next(line for line in lines if line.startswith(f"{tier} "))
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def test_a_second_process_on_the_same_redis_compiles_nothing_and_stats_show_it(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    first, _ = _run("double", tmp_path / "a", "--redis", redis_server.url())
    second, _ = _run("double", tmp_path / "b", "--redis", redis_server.url())
    assert first["correct"] and second["correct"]
    assert first["compiles"] == 2 and second["compiles"] == 0
    table = _stats(tmp_path / "b", redis_server.url())
    row = _row(table, "redis")
    redis = second["tiers"]["redis"]
    assert int(row["hits"]) == redis["hits"] > 0 and int(row["misses"]) == redis["misses"]
    assert row["read"].endswith("KiB") and row["errors"] == "0"
    assert "maxmemory-policy noeviction" in table  # what the Redis itself says


def test_redis_down_costs_one_warning_and_counted_errors(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url()
    redis_server.kill()
    report, stderr = _run("double", tmp_path / "cache", "--redis", url)
    assert report["correct"] and report["compiles"] == report["unique_regions"] == 2
    assert report["tiers"]["redis"]["errors"] >= 1
    assert stderr.count(WARNING) == 1, stderr[-4000:]
    table = _stats(tmp_path / "cache", url)
    assert int(_row(table, "redis")["errors"]) == report["tiers"]["redis"]["errors"]
    assert f"redis      {url}: not reachable" in table


def test_a_hung_redis_costs_deadlines_not_results(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """SIGSTOP: Redis accepts connections and answers nothing. Each call waits its
    deadline (0.5 s) until the breaker opens; then calls fail at once."""
    redis_server.pause()
    try:
        report, stderr = _run(
            "double", tmp_path / "cache", "--redis", redis_server.url(), "--timeout", "0.5"
        )
    finally:
        redis_server.resume()
    assert report["correct"] and report["compiles"] == 2
    assert report["tiers"]["redis"]["errors"] >= 1
    assert stderr.count(WARNING) == 1
    assert report["seconds"] < 30


def test_redis_killed_mid_run_loses_nothing_and_is_used_again_once_back(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """In one process: what was stored before, during and after an outage is all in the
    local tier; what is stored after Redis is back reaches Redis again."""
    stats = CacheStats()
    local = LmdbStore(tmp_path / "local", 1 << 30, stats)
    redis = RedisStore(
        redis_server.url(), stats, timeout_s=0.5, breaker=CircuitBreaker(2, cooldown_s=0.5)
    )
    cache = TieredCache([local, redis], redis, stats, fallback_leases=local)
    stored = {f"{n:032x}": Artifact("text", "1", os.urandom(1000)) for n in range(30)}
    keys = list(stored)
    for key in keys[:10]:
        cache.put(key, stored[key])
    redis_server.kill()
    for key in keys[10:20]:
        with cache.compile_lease(key) as ready:  # Redis's lease fails: the local one serves
            assert ready is None
            cache.put(key, stored[key])
    assert stats.tier("redis").errors >= 1
    for key in keys[:20]:
        found = cache.get(key)
        assert found is not None and found[0].payload == stored[key].payload
        assert found[1] == "local"

    redis_server.start()  # empty: a restarted cache Redis
    deadline = time.monotonic() + 10
    for key in keys[20:]:
        cache.put(key, stored[key])
    while RedisStore(redis_server.url(), CacheStats()).find_missing([keys[-1]]):
        assert time.monotonic() < deadline, "Redis is not written to again"
        time.sleep(0.2)
        cache.put(keys[-1], stored[keys[-1]])
    fresh = RedisStore(redis_server.url(), CacheStats())
    assert fresh.get(keys[-1]) is not None
    assert all(local.get(key) is not None for key in keys)  # nothing lost locally
    cache.close()
    local.close()
