"""A server that fails shows as failing, to the user and the operator: with the server
down or refusing the token, `fcache.stats(model)` and `fcache stats` count remote errors,
not misses (they said "remote: 0 hits, 2 misses" and nothing else), and the log warns
again, with a count, for as long as the outage lasts (it went quiet after one warning).

A real model through fcache.jit (the text executor: the whole pipeline, no C++ compiler)
against a real server or a socket nobody listens on; the CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fcache
from fcache import process
from fcache.cache.remote import RemoteStore
from fcache.stats import CacheStats
from tests.service.support import ROOT, StartServer, assert_outage_warned_with_counts
from tests.text_executor import register


@pytest.fixture(autouse=True)
def _fresh_process_state() -> object:
    register()
    torch._dynamo.reset()
    yield
    process.reset()  # the sessions (and their stores) of this test's settings


def _run_model(cache_dir: Path, server: str, token_file: Path | None = None) -> fcache.ModelStats:
    settings = fcache.Settings(
        cache_dir=cache_dir,
        server=server,
        token_file=token_file,
        executors=("text",),
        compile_workers=1,
        progress=False,
        server_timeout_s=5.0,
    )

    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sin() + x.cos()

    compiled = fcache.jit(f, settings=settings)
    compiled(torch.randn(8))
    return fcache.stats(compiled)


def _cli_stats(cache_dir: Path) -> tuple[dict, str]:  # type: ignore[type-arg]
    env = {**os.environ, "FCACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-m", "fcache.cli", "stats"]
    as_json = subprocess.run([*run, "--json"], env=env, capture_output=True, text=True)
    table = subprocess.run(run, env=env, capture_output=True, text=True)
    assert as_json.returncode == 0 and table.returncode == 0, as_json.stderr + table.stderr
    return json.loads(as_json.stdout), table.stdout


def _assert_remote_errors(stats: fcache.ModelStats, cache_dir: Path) -> None:
    assert stats.unique_regions > 0
    assert stats.errors.get("remote", 0) >= stats.unique_regions
    assert stats.misses.get("remote", 0) == 0  # the server never said "not here"
    assert stats.misses["local"] == stats.unique_regions
    line = next(r for r in str(stats).splitlines() if r.startswith("Look-ups, remote"))
    assert f"0 hits, 0 misses, {stats.errors['remote']} errors" in line
    process.reset()  # flushes this process's counters for `fcache stats`
    report, table = _cli_stats(cache_dir)
    remote = report["tiers"]["remote"]
    assert remote["errors"] >= stats.unique_regions and remote["misses"] == 0
    assert f"errors     remote {remote['errors']}: calls that failed" in table


def test_a_server_that_is_down_counts_errors_not_misses(tmp_path: Path) -> None:
    nobody = f"unix:{tmp_path / 'nobody.sock'}"
    _assert_remote_errors(_run_model(tmp_path / "cache", nobody), tmp_path / "cache")


def test_a_refused_token_counts_errors_not_misses(
    start_server: StartServer, tmp_path: Path
) -> None:
    tokens = tmp_path / "write-tokens"
    tokens.write_text("the-right-one\n")
    server = start_server("--write-token-file", str(tokens))
    wrong = tmp_path / "token"
    wrong.write_text("a-wrong-one\n")
    stats = _run_model(tmp_path / "cache", server.unix, token_file=wrong)
    _assert_remote_errors(stats, tmp_path / "cache")


def test_an_outage_is_warned_about_again_with_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A repeat every 0.3 s instead of a minute.
    stats = CacheStats()
    store = RemoteStore(f"unix:{tmp_path / 'nobody.sock'}", stats, warn_every_s=0.3)
    try:
        assert_outage_warned_with_counts(caplog, "fcache.cache.remote.store", store.get)
    finally:
        store.close()
    # Every call counted, those the circuit breaker skipped too.
    assert stats.tier("remote").errors == 20
