"""bench.varlen end to end at smoke size: fresh processes (fcache cold, then warm from its
cache with an empty Inductor cache), per-length rows checked against eager, the JSON and
the markdown table written. One length twice: the harness is the point here (the dynamic
compile itself is tests/unit/engine/test_dynamic.py's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench.varlen import lengths_of, steady_ratios, steady_table
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


def test_lengths_are_a_list_or_a_seeded_draw() -> None:
    assert lengths_of("2048,1024,2048", 256, 2048) == [2048, 1024, 2048]
    drawn = lengths_of("20", 256, 2048)
    assert drawn == lengths_of("20", 256, 2048)  # the same every run
    assert len(set(drawn)) == 20 and all(256 <= n <= 2048 for n in drawn)


def test_steady_steps_are_compared_per_length_by_their_median_over_rounds() -> None:
    def run(system: str, steps: list[float]) -> dict[str, object]:
        return {"system": system, "rows": [{"steady_step_s": t} for t in steps]}

    results = [
        run("torch.compile", [1.0, 2.0]),
        run("fcache-cold", [1.2, 1.0]),
        run("torch.compile", [3.0, 2.0]),
        run("fcache-cold", [1.0, 3.0]),
        run("torch.compile", [2.0, 2.0]),
        run("fcache-cold", [2.1, 2.0]),
    ]
    ratios = steady_ratios(results, [512, 1024])
    assert ratios == {"fcache-cold": [pytest.approx(1.2 / 2.0), pytest.approx(2.0 / 2.0)]}
    text = steady_table([*results, run("fcache-warm", [2.2, 2.2])], [512, 1024])
    assert "| fcache-warm | 1.10x | 1.10-1.10x | 2 of 2 |" in text


def test_smoke_run_writes_rows_and_table(tmp_path: Path) -> None:
    out = tmp_path / "varlen.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    proc = fresh.run(
        [sys.executable, "-m", "bench.varlen", "--smoke", "--lengths", "12,12",
         "--systems", "fcache-cold,fcache-warm", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["all_ok"] and doc["lengths"] == [12, 12]
    cold, warm = doc["results"]
    assert [cold["system"], warm["system"]] == ["fcache-cold", "fcache-warm"]
    for result in (cold, warm):
        assert [r["length"] for r in result["rows"]] == [12, 12]
        for row in result["rows"]:
            assert row["first_step_s"] > 0 and row["steady_step_s"] > 0 and row["ok"]
    assert warm["totals"]["functions_loaded"] == 1 and warm["totals"]["region_compiles"] == 0
    assert "| total |" in out.with_suffix(".md").read_text()
