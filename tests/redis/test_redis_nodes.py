"""Two "nodes" on one Redis: two fcache-server processes (separate LMDB stores, each with
`--redis`), each with its own fcache processes (separate local caches), real compiles.

- node B's first step compiles nothing after node A's (Inductor: test_nodes_inductor.py);
- two nodes missing the same regions at once compile each region once;
- a node killed mid-compile: its Redis lease lapses and the other node takes it over;
- killing Redis mid-run loses nothing a node stored, and fcache goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fcache.cache.redis import layout
from tests.redis.support import (
    RUN_TIMEOUT_S,
    RedisServer,
    finish,
    redis_counters,
    start,
    start_node,
)
from tests.service.support import ROOT, StartServer, client


def test_two_nodes_missing_together_compile_each_region_once(
    start_server: StartServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    node_a = start_node(start_server, redis_server, "a", "--metrics-listen", "127.0.0.1:0")
    node_b = start_node(start_server, redis_server, "b")
    # Each compile takes a second, so the two processes' compiles overlap.
    ranks = [
        start("tests.redis.node", "double", str(tmp_path / f"rank-{n}"), "--server", node.unix,
               "--compile-delay", "1")
        for n, node in (("a", node_a), ("b", node_b))
    ]  # fmt: skip
    results = [finish(rank) for rank in ranks]
    assert all(r["correct"] for r in results)
    unique = results[0]["unique_regions"]
    assert unique == 2 and sum(r["compiles"] for r in results) == unique
    redis_a, redis_b = redis_counters(node_a.tcp), redis_counters(node_b.tcp)
    assert redis_a["lease_grants"] + redis_b["lease_grants"] == unique
    assert redis_a["lease_waits"] + redis_b["lease_waits"] >= 1
    assert redis_a["puts"] + redis_b["puts"] >= unique

    # `fcache stats --server` shows the node's Redis tier; its metrics export it.
    stats = subprocess.run(
        [sys.executable, "-m", "fcache.cli", "stats", "--server", node_a.unix],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    row = next(line.split() for line in stats.splitlines() if line.startswith("redis "))
    assert [int(row[1]), int(row[3])] == [int(redis_a["hits"]), int(redis_a["puts"])]
    ready = json.loads((node_a.log.parent / "ready.json").read_text())
    with urllib.request.urlopen(f"http://{ready['metrics']}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    named = {"bytes_read": "read_bytes", "bytes_written": "written_bytes"}
    for field in ("hits", "misses", "bytes_read", "bytes_written", "errors", "lease_grants"):
        name = named.get(field, field)
        assert f"fcache_server_redis_{name}_total {float(redis_a[field])}" in metrics


def test_a_node_killed_mid_compile_is_taken_over(
    start_server: StartServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    node_a = start_node(start_server, redis_server, "a", "--redis-lease-ttl", "2")
    node_b = start_node(start_server, redis_server, "b", "--redis-lease-ttl", "2")
    compiling = tmp_path / "a-compiling"
    rank_a = start("tests.redis.node", "double", str(tmp_path / "rank-a"), "--server",
                    node_a.unix, "--compile-delay", "600", "--compiling",
                    str(compiling))  # fmt: skip
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not compiling.exists():
        assert rank_a.poll() is None and time.monotonic() < deadline, rank_a.communicate()
        time.sleep(0.05)
    held = redis_server.client().keys(layout.lease_key("*"))
    assert len(held) == 1  # node A holds the region's lease in Redis for its rank
    rank_b = start("tests.redis.node", "double", str(tmp_path / "rank-b"), "--server",
                    node_b.unix)  # fmt: skip
    while redis_counters(node_b.tcp).get("lease_waits", 0) < 1:
        assert rank_b.poll() is None and time.monotonic() < deadline, rank_b.communicate()
        time.sleep(0.1)
    node_a.kill()  # the node dies mid-compile, with its rank
    rank_a.kill()
    rank_a.communicate()
    result = finish(rank_b)
    assert result["correct"] and result["compiles"] == result["unique_regions"] == 2
    assert redis_counters(node_b.tcp)["lease_grants"] == 2


def test_killing_redis_mid_run_loses_nothing(
    start_server: StartServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    node = start_node(start_server, redis_server, "a", "--redis-timeout", "1")
    first = finish(start("tests.redis.node", "double", str(tmp_path / "r1"), "--server", node.unix))
    assert first["correct"] and first["compiles"] == 2
    redis_server.kill()
    second = finish(
        start("tests.redis.node", "triple", str(tmp_path / "r2"), "--server", node.unix)
    )
    assert second["correct"] and second["compiles"] == 2
    assert redis_counters(node.tcp)["errors"] >= 1
    # Everything either process stored is on the node, and a fresh process loads it all.
    store = client(node.unix)
    for key in first["keys"] + second["keys"]:
        assert store.get(key) is not None
    again = finish(start("tests.redis.node", "triple", str(tmp_path / "r3"), "--server", node.unix))
    assert again["correct"] and again["compiles"] == 0
