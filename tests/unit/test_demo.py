"""`fcache demo` shows what fcache is for: a legend, the rows (cold, warm, and a second
'rank' with an empty cache sharing a local fcache-server, then torch.compile), what each
compiled and loaded and from where, region instances against unique regions, a status
line while a row runs, a one-line verdict, and commands to look at its cache that work as
printed without an activated virtual environment. The model runs are stubbed here (the
rows' JSON as fcache.examples.run prints it; tests/e2e run the real model); the server,
the cache the printed commands read and the commands themselves are real."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fcache import demo
from fcache.cache.artifact import Artifact, encode
from fcache.cache.lmdb import LmdbStore
from fcache.errors import FcacheError

ROOT = Path(__file__).resolve().parents[2]


def _stub(calls: list[tuple[str, str, dict[str, str]]]) -> Any:
    def run_one(system: str, layers: int, cfg: demo.DemoConfig, env: dict[str, str],
                status: Any = None, cache: str = "") -> dict:  # fmt: skip
        calls.append((system, cache, env))
        if status is not None:
            status(system, cache, 12.0, "model: 5/12 unique regions (5 compiled)")
        if system == "fcache" and cache == "cold":  # a real cache for the printed commands
            store = LmdbStore(Path(env["FCACHE_DIR"]), 1 << 30)
            store.put("a" * 32, encode(Artifact("inductor", "1", b"kernel")))
            store.close()
        row = {"start_s": {"cold": 60.0, "warm": 2.5, "shared": 3.0}[cache],
               "steady_step_s": 0.003, "max_abs_error": 1e-7}  # fmt: skip
        if system == "fcache":
            tier = {"cold": {}, "warm": {"local": 12}, "shared": {"remote": 12}}[cache]
            return {**row, "compiles": 12 if cache == "cold" else 0, "regions": 20,
                    "unique_regions": 12, "hits": {"memory": 8, **tier}}  # fmt: skip
        return {**row, "compiles": 2 if cache == "cold" else 0,
                "graph_cache_hits": 0 if cache == "cold" else 2}  # fmt: skip

    return run_one


@pytest.fixture
def shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[Any]]:
    calls: list[tuple[str, str, dict[str, str]]] = []
    monkeypatch.setattr(demo, "run_one", _stub(calls))
    monkeypatch.setattr(demo, "LINE_EVERY_S", 10.0)
    out = io.StringIO()
    demo.run_demo(demo.DemoConfig(directory=tmp_path / "demo"), out)
    return out.getvalue(), calls


def test_demo_shows_legend_rows_verdict_and_where_its_cache_is(
    shown: tuple[str, list[Any]],
) -> None:
    text, calls = shown
    assert "How to read it" in text and "shared   another rank or node" in text
    assert [(s, c) for s, c, _ in calls] == [
        ("fcache", "cold"), ("fcache", "warm"), ("fcache", "shared"),
        ("torch.compile", "cold"), ("torch.compile", "warm"),
    ]  # fmt: skip
    # The shared 'rank' had its own empty cache and the same server as the cold run.
    cold_env, shared_env = calls[0][2], calls[2][2]
    assert shared_env["FCACHE_SERVER"] == cold_env["FCACHE_SERVER"].strip()
    assert shared_env["FCACHE_SERVER"].startswith("unix:")
    assert shared_env["FCACHE_DIR"] != cold_env["FCACHE_DIR"]
    # ...and the node's one signing key: with a key of its own it could verify (so load)
    # nothing the cold run stored, and compiled every region again.
    key = shared_env["FCACHE_SIGNING_KEY_FILE"]
    assert key == cold_env["FCACHE_SIGNING_KEY_FILE"] and Path(key).stat().st_size >= 32
    rows = {tuple(line.split()[1:3]): line for line in text.splitlines() if line[:1] == "2"}
    # What each compiled and loaded, in its own unit, and from where.
    assert "12 regions" in rows[("fcache", "cold")] and "20 (12)" in rows[("fcache", "cold")]
    assert "12 regions (disk)" in rows[("fcache", "warm")]
    assert "12 regions (server)" in rows[("fcache", "shared")]
    assert "2 graphs" in rows[("torch.compile", "cold")]
    assert "2 graphs (its cache)" in rows[("torch.compile", "warm")]
    verdict = next(line for line in text.splitlines() if line.startswith("Verdict:"))
    assert "20 regions are 12 unique ones; fcache compiled 12" in verdict
    assert "empty cache sharing the server: 12 loaded, 0 compiled" in verdict


def test_a_running_row_shows_its_progress(shown: tuple[str, list[Any]]) -> None:
    text, _ = shown  # not a terminal: a line every LINE_EVERY_S seconds
    assert "  ... fcache cold, 12 s: model: 5/12 unique regions (5 compiled)" in text


def test_each_row_computes_on_one_thread_on_a_cpu(shown: tuple[str, list[Any]]) -> None:
    """Two threads on a busy 2-core machine stalled steady steps (bench/results/
    cpu-demo-steady-2026-11-27): torch.compile's cold row showed 825 ms against 15.6 ms."""
    _, calls = shown
    assert {env["OMP_NUM_THREADS"] for _, _, env in calls} == {
        os.environ.get("OMP_NUM_THREADS", "1")
    }


def test_the_printed_commands_work_as_printed_without_the_venv(
    shown: tuple[str, list[Any]],
) -> None:
    """They failed with `fcache: command not found` outside an activated venv."""
    text, _ = shown
    commands = [line.strip() for line in text.splitlines() if line.startswith("  FCACHE_DIR=")]
    assert len(commands) == 2
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    for command in commands:
        done = subprocess.run(
            ["/bin/sh", "-c", command], cwd=Path.cwd(), env=bare, capture_output=True, text=True
        )
        assert done.returncode == 0, (command, done.stderr)
        assert "a" * 32 in done.stdout or "entries    1" in done.stdout, done.stdout


def test_the_fcache_command_is_the_one_beside_this_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "fcache").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    assert demo.fcache_command() == ".venv/bin/fcache"
    monkeypatch.chdir("/")
    assert demo.fcache_command() == str(venv / "fcache")
    (venv / "fcache").unlink()
    assert demo.fcache_command() == f"{venv / 'python'} -m fcache.cli"


def test_a_status_line_is_rewritten_in_place_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    line = demo._StatusLine(out)
    line("fcache", "cold", 1.0, "")
    line("fcache", "cold", 2.0, "model: 3/12 unique regions")
    line.clear()
    written = out.getvalue()
    assert written.startswith("\r  ... fcache cold, 1 s: capturing, compiling")
    assert "\r  ... fcache cold, 2 s: model: 3/12 unique regions" in written
    assert written.endswith("\r") and "\n" not in written


def test_a_child_s_progress_is_read_from_its_stderr() -> None:
    # Lines (the child's stderr is a pipe), read in pieces; the last one half written.
    err = ["fcache: model: compiled a region (1/12", " unique regions ready)\nfcache: mo",
           "del: compiled a region (4/12 unique regions ready)\nfcache: model: compi"]  # fmt: skip
    assert demo._latest_progress(err) == "model: compiled a region (4/12 unique regions ready)"
    # Rewritten in place (FCACHE_PROGRESS=1): the last complete status.
    err = ["\rfcache: model: 3/12 unique regions\rfcache: model: 4/12 unique regions\rfcach"]
    assert demo._latest_progress(err) == "model: 4/12 unique regions"
    assert demo._latest_progress(["W1127 a torch warning\n"]) == ""


def test_a_failed_row_shows_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = time.monotonic()
    row = demo.run_one(
        "fcache",
        2,
        demo.DemoConfig(family="no-such-family"),
        dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert row["error"] == "exit code 2" and "no-such-family" in row["stderr"]
    assert time.monotonic() - started < 120


def test_demo_empties_only_its_own_directory(tmp_path: Path) -> None:
    mine = tmp_path / "theirs"
    mine.mkdir()
    (mine / "precious").write_text("keep")
    with pytest.raises(FcacheError, match="not the demo's"):
        demo.run_demo(demo.DemoConfig(directory=mine), io.StringIO())
    assert (mine / "precious").exists()


def test_verdict_names_what_failed() -> None:
    rows = [{"system": "fcache", "cache": "cold", "layers": 2, "error": "exit code 1"}]
    assert demo.verdict(rows) == "Verdict: the demo did not finish (fcache cold failed)."
