"""Two "nodes" on one Redis, with real Inductor compiles: node B's first step compiles
nothing after node A's. Each node is an fcache-server process (its own LMDB store,
`--redis`); each rank a fresh process with an empty local cache (tests/service/run_model.py:
a tiny decoder's training step, compiled with Inductor on the CPU, checked against eager).
A file of its own so that pytest-xdist runs it beside the other Redis tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.redis.support import RedisServer, finish, redis_counters, start, start_node
from tests.reliability.support import key_file
from tests.service.support import RawStub, StartServer


@pytest.mark.slow
def test_node_b_compiles_nothing_after_node_a(
    start_server: StartServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    node_a = start_node(start_server, redis_server, "a")
    node_b = start_node(start_server, redis_server, "b")
    key = str(key_file(tmp_path))  # the cluster's one key, as docs/redis.md sets it up
    first = finish(start("tests.service.run_model", node_a.unix, str(tmp_path / "rank-a"), key))
    assert first["correct"] and first["compiles"] > 0
    # Node A wrote every artifact back to Redis; node B has never seen any of them.
    assert RawStub(node_b.unix).stats().entries == 0
    second = finish(start("tests.service.run_model", node_b.unix, str(tmp_path / "rank-b"), key))
    assert second["correct"] and second["compiles"] == 0
    assert second["hits"].get("remote", 0) > 0
    redis_b = redis_counters(node_b.tcp)
    assert redis_b["hits"] > 0 and redis_b["bytes_read"] > 0 and redis_b["errors"] == 0
