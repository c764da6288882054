"""`fcache stats --server` against a real server: the table and --json agree with the RPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.service.support import StartServer, client, envelope, key_of

ROOT = Path(__file__).resolve().parents[2]


def _stats(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fcache.cli", "stats", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_stats_of_a_server(start_server: StartServer) -> None:
    server = start_server()
    store = client(server.unix)
    store.put(key_of(1), envelope(2048, compile_seconds=3.0))
    assert store.get(key_of(1)) is not None
    assert store.get(key_of(2)) is None
    store.close()

    report = json.loads(_stats("--server", server.unix, "--json").stdout)
    assert report["entries"] == 1
    counters = report["counters"]
    assert (counters["puts"], counters["hits"], counters["misses"]) == (1, 1, 1)
    assert counters["compile_seconds_saved"] == 3.0

    table = _stats("--server", server.tcp)
    assert table.returncode == 0, table.stderr
    assert "entries    1" in table.stdout
    assert "3.0s" in table.stdout  # compile seconds saved by the one hit


def test_stats_of_an_unreachable_server_is_one_clear_line(tmp_path: Path) -> None:
    out = _stats("--server", f"unix:{tmp_path}/nobody.sock")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("fcache:")
