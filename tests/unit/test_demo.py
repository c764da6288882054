"""`fcache demo` shows what fcache is for: a legend, the rows (cold, warm, and a second
'rank' with an empty cache sharing a local fcache-server, then torch.compile), a one-line
verdict, and where its cache stays for `fcache stats`/`ls`. The model runs are stubbed
here (tests/e2e run the real model); the server is real."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from fcache import demo
from fcache.errors import FcacheError


def _stub(calls: list[tuple[str, str, dict[str, str]]]) -> Any:
    def run_one(system: str, layers: int, cfg: demo.DemoConfig, env: dict[str, str]) -> dict:
        cache = {0: "cold", 1: "warm", 2: "shared"}[sum(1 for s, _, _ in calls if s == system)]
        calls.append((system, cache, env))
        compiles = {"cold": 12 if system == "fcache" else 2}.get(cache, 0)
        first = {"cold": 60.0, "warm": 2.5, "shared": 3.0}[cache]
        return {"start_s": first, "steady_step_s": 0.01, "compiles": compiles,
                "unique_regions": 12, "max_abs_error": 1e-7}  # fmt: skip

    return run_one


def test_demo_shows_legend_rows_verdict_and_where_its_cache_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str, dict[str, str]]] = []
    monkeypatch.setattr(demo, "run_one", _stub(calls))
    out = io.StringIO()
    rows = demo.run_demo(demo.DemoConfig(directory=tmp_path / "demo"), out)
    text = out.getvalue()
    assert "How to read it" in text and "shared   another rank or node" in text
    assert [(r["system"], r["cache"]) for r in rows] == [
        ("fcache", "cold"), ("fcache", "warm"), ("fcache", "shared"),
        ("torch.compile", "cold"), ("torch.compile", "warm"),
    ]  # fmt: skip
    # The shared 'rank' had its own empty cache and the same server as the cold run.
    cold_env, shared_env = calls[0][2], calls[2][2]
    assert shared_env["FCACHE_SERVER"] == cold_env["FCACHE_SERVER"].strip()
    assert shared_env["FCACHE_SERVER"].startswith("unix:")
    assert shared_env["FCACHE_DIR"] != cold_env["FCACHE_DIR"]
    verdict = next(line for line in text.splitlines() if line.startswith("Verdict:"))
    assert "compiled 12 regions once" in verdict and "sharing the server compiled 0" in verdict
    assert f"FCACHE_DIR={cold_env['FCACHE_DIR']} fcache stats" in text
    assert f"FCACHE_DIR={cold_env['FCACHE_DIR']} fcache ls" in text


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
