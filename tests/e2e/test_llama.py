"""The Llama-style example model, end to end on CPU: real compiles, real LMDB, fresh processes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fcache.cache.artifact import decode, encode
from fcache.cache.lmdb import LmdbStore
from tests import fresh
from tests.e2e.runner import (
    assert_matches_eager,
    command,
    compiler_shims,
    env_for,
    parse_report,
    run_model,
)

# Real Inductor compiles in fresh processes: minutes on a small machine.
pytestmark = pytest.mark.slow


def test_cold_run_matches_eager_and_compiles_each_unique_region_once(
    warm_llama: tuple[Path, dict[str, Any]],
) -> None:
    _, report = warm_llama
    assert_matches_eager(report)
    assert report["compiles"] == report["unique_regions"] > 0
    assert report["regions"] > report["unique_regions"]  # layers share regions
    assert report["fallbacks"] == 0
    assert report["executors"] == {"inductor": report["unique_regions"]}


def test_six_layers_find_every_region_of_three(
    warm_llama: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    # No region depends on the depth: a six-layer model on the three-layer model's cache
    # compiles nothing (a copy, so that the other tests see the three-layer cache as made).
    cache_dir, three = warm_llama
    shutil.copytree(cache_dir, tmp_path / "fcache")
    six = run_model(6, env_for(tmp_path / "fcache", tmp_path / "inductor"))
    assert_matches_eager(six)
    assert six["compiles"] == 0
    assert six["unique_regions"] == three["unique_regions"]
    assert six["regions"] > three["regions"]


def test_warm_process_with_empty_inductor_cache_builds_nothing(
    warm_llama: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cache_dir, cold = warm_llama
    log = tmp_path / "compilers.log"
    env = env_for(cache_dir, tmp_path / "empty-inductor",
                  PATH=compiler_shims(tmp_path / "shims", log))  # fmt: skip
    report = run_model(3, env)
    assert_matches_eager(report)
    assert report["compiles"] == 0
    assert report["hits"] == {"local": cold["unique_regions"]}
    runs = log.read_text().splitlines() if log.exists() else []
    assert runs == [], f"compilers ran in a warm process: {runs[:5]}"


def test_two_processes_compiling_into_one_cache_at_once(tmp_path: Path) -> None:
    env = env_for(tmp_path / "fcache", tmp_path / "inductor")
    # One layer: every kind of region a block has, each compiled cold by one of the two
    # processes; the depth does not matter to single flight (a second layer cost about 9
    # CPU seconds more on 2 cores).
    procs = [
        fresh.popen(command(1), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True)
        for _ in range(2)
    ]  # fmt: skip
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-4000:]
        reports.append(parse_report(out))
    for report in reports:
        assert_matches_eager(report)
    unique = reports[0]["unique_regions"]
    # Single flight through the shared LMDB: each region compiled by one of the two.
    assert sum(r["compiles"] for r in reports) == unique
    store = LmdbStore(tmp_path / "fcache", 1 << 30)
    try:
        # Raises on a torn or corrupt entry.
        executors = [decode(store.get(e.key)).executor for e in store.entries()]
        # The regions, and torch entries: the model's stored program and its whole stored
        # functions, one per input signature (first write wins).
        torch_entries = executors.count("torch")
        assert len(executors) - torch_entries == unique and torch_entries >= 2
    finally:
        store.close()


def test_corrupt_entry_is_counted_replaced_and_results_stay_correct(
    warm_llama: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cache_dir, _ = warm_llama
    copy = tmp_path / "fcache"
    shutil.copytree(cache_dir, copy)
    store = LmdbStore(copy, 1 << 30)
    try:
        # A region's entry (not a torch entry: those are rebuilt by tracing, not compiling).
        keys = [e.key for e in store.entries()]
        victim = next(k for k in keys if decode(store.get(k)).executor != "torch")
        data = bytearray(store.get(victim))
        data[len(data) // 2] ^= 0xFF  # one flipped bit in the payload
        store.put(victim, bytes(data))
        before = store.read_stats().get("local")
    finally:
        store.close()

    # Inductor's own cache from the cold run (a copy): the region still goes through fcache's
    # compile (counted, stored again), without Inductor's C++ builds for it (most of the
    # test's time on 2 cores), which are not what this test is about.
    shutil.copytree(cache_dir.parent / "inductor", tmp_path / "inductor")
    report = run_model(2, env_for(copy, tmp_path / "inductor"))
    assert_matches_eager(report)
    assert report["compiles"] == 1

    store = LmdbStore(copy, 1 << 30)
    try:
        after = store.read_stats()["local"]
        assert after.corrupt == (before.corrupt if before else 0) + 1
        decode(store.get(victim))  # replaced by the fresh compile
        assert encode(decode(store.get(victim)))  # and it re-encodes cleanly
    finally:
        store.close()
