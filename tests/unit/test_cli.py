"""The `fcache` command against a real LMDB cache: stats, ls, gc, explain, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fcache.cache.artifact import Artifact
from fcache.cache.tiered import TieredCache
from fcache.config import Settings
from fcache.stats import CacheStats

ROOT = Path(__file__).resolve().parents[2]


def fcache_cli(*args: str, cache_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fcache.cli", *args],
        env={**os.environ, "FCACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _artifact(region: str, seconds: float, size: int) -> Artifact:
    node = {"op": "aten.add.Tensor", "args": [], "kwargs": {}}
    return Artifact(
        "inductor",
        "aoti-1",
        b"x" * size,
        compile_seconds=seconds,
        key=(("format", "fcache-key-1"), ("region", region), ("target", "cpu:avx2")),
        region=json.dumps({"inputs": [], "nodes": [node], "outputs": []}),
    )


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    stats = CacheStats()
    cache = TieredCache.open(Settings(cache_dir=tmp_path, progress=False), stats)
    cache.put("a" * 32, _artifact("r1", 2.5, 1000))
    cache.put("b" * 32, _artifact("r2", 4.0, 3000))
    assert cache.get("a" * 32) is not None  # one hit, saving 2.5 s
    assert cache.get("c" * 32) is None  # one miss
    stats.add("executor:inductor", compiles=2, compile_seconds=6.5, invalid=1)
    stats.add("fallback:validation-failed", fallbacks=1)
    cache.close()
    return tmp_path


def test_stats_reports_entries_hits_and_saved_seconds(filled: Path) -> None:
    out = fcache_cli("stats", "--json", cache_dir=filled)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["entries"] == 2
    local = report["tiers"]["local"]
    assert (local["hits"], local["misses"], local["puts"]) == (1, 1, 2)
    assert local["compile_seconds_saved"] == pytest.approx(2.5)
    assert report["executors"]["inductor"]["compiles"] == 2  # compiles are the executor's
    assert local["compiles"] == 0
    table = fcache_cli("stats", cache_dir=filled).stdout
    assert "entries    2" in table and "saved      2.5s" in table
    assert "compiles   2 (6.5s spent)" in table
    assert report["executors"]["inductor"]["invalid"] == 1
    assert report["fallbacks"] == {"validation-failed": 1}
    assert "1 validation failed" in table and "fallbacks  1 regions ran in eager" in table


def test_ls_lists_entries_with_their_executor(filled: Path) -> None:
    rows = json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout)
    assert {r["key"] for r in rows} == {"a" * 32, "b" * 32}
    assert {r["executor"] for r in rows} == {"inductor"}


def test_explain_names_the_component_that_differs(filled: Path) -> None:
    out = fcache_cli("explain", "a" * 32, "b" * 32, cache_dir=filled)
    assert out.returncode == 0, out.stderr
    assert "differ in: region" in out.stdout
    single = fcache_cli("explain", "a" * 32, cache_dir=filled).stdout
    assert "inductor aoti-1" in single and "aten.add.Tensor" in single


def test_gc_evicts_down_to_a_size(filled: Path) -> None:
    out = fcache_cli("gc", "--max-bytes", "1500", cache_dir=filled)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("evicted 1 entries")
    assert len(json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout)) == 1
    assert fcache_cli("gc", "--all", cache_dir=filled).returncode == 0
    assert json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout) == []


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("explain", "not-a-key"), {}, "is not a key"),
        (("explain", "d" * 32), {}, "no readable entry"),
        (("stats",), {"FCACHE_MAX_BYTES": "lots"}, "FCACHE_MAX_BYTES='lots' is invalid"),
        (("gc", "--max-bytes", "-3"), {}, "--max-bytes='-3' is invalid"),
        (("demo", "--layers", "two"), {}, "--layers 'two'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    filled: Path, args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    out = fcache_cli(*args, cache_dir=filled, **env)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_no_cache_yet_is_a_clear_error(tmp_path: Path) -> None:
    out = fcache_cli("stats", cache_dir=tmp_path / "nothing-here")
    assert out.returncode == 2
    assert "no fcache cache at" in out.stderr


def test_stats_zero_sets_the_counters_to_zero_and_keeps_the_entries(filled: Path) -> None:
    out = fcache_cli("stats", "--zero", cache_dir=filled)
    assert out.returncode == 0, out.stderr
    assert "set to zero" in out.stdout
    report = json.loads(fcache_cli("stats", "--json", cache_dir=filled).stdout)
    assert report["entries"] == 2
    assert report["tiers"] == {} and report["executors"] == {} and report["fallbacks"] == {}
    assert json.loads(fcache_cli("stats", "--zero", "--json", cache_dir=filled).stdout) == {
        "zeroed": True,
        "cache_dir": str(filled),
    }
    refused = fcache_cli("stats", "--zero", "--server", "unix:/nowhere", cache_dir=filled)
    assert refused.returncode == 2 and "local cache" in refused.stderr


def test_version() -> None:
    from fcache.version import __version__

    out = fcache_cli("--version", cache_dir=Path("/nonexistent"))
    assert (out.returncode, out.stdout.strip()) == (0, f"fcache {__version__}")


def test_config_shows_every_setting_and_where_it_came_from(tmp_path: Path) -> None:
    from fcache.config import VARIABLES

    out = fcache_cli("config", cache_dir=tmp_path / "c", FCACHE_MAX_BYTES="512M")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[1]: line for line in out.stdout.splitlines() if "=" in line}
    assert set(lines) >= {v.name for v in VARIABLES}
    assert lines["FCACHE_MAX_BYTES"].split() == ["(environment)", "FCACHE_MAX_BYTES", "=", "512M"]
    assert lines["FCACHE_DIR"].endswith(f"= {tmp_path / 'c'}")
    assert lines["FCACHE_WHOLE"].startswith("(default)")
    rows = json.loads(fcache_cli("config", "--json", "--dir", "/x", cache_dir=tmp_path).stdout)
    by_name = {r["name"]: r for r in rows}
    assert (by_name["FCACHE_DIR"]["value"], by_name["FCACHE_DIR"]["source"]) == ("/x", "--dir")
    bad = fcache_cli("config", cache_dir=tmp_path, FCACHE_WHOLE="auto")
    assert bad.returncode == 2 and "FCACHE_WHOLE='auto' is invalid" in bad.stderr


def test_ls_and_explain_do_not_reorder_what_gc_evicts(filled: Path) -> None:
    """Listing used to mark every entry as just used, least recent last: the next gc then
    evicted the entry used most recently."""
    before = {
        r["key"]: r["last_access"]
        for r in json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout)
    }
    assert fcache_cli("ls", cache_dir=filled).returncode == 0
    assert fcache_cli("explain", "b" * 32, cache_dir=filled).returncode == 0
    after = {
        r["key"]: r["last_access"]
        for r in json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout)
    }
    assert after == before
    newest = max(before, key=before.__getitem__)
    out = fcache_cli("gc", "--max-bytes", "3500", cache_dir=filled)  # room for one entry
    assert out.stdout.startswith("evicted 1 entries"), out.stdout
    kept = json.loads(fcache_cli("ls", "--json", cache_dir=filled).stdout)
    assert [r["key"] for r in kept] == [newest]
