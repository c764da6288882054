"""bench.survey end to end on two tiny families with the text executor: a cold and a warm
fresh process per family (two families at once), the table's rows, loss and gradients
against eager, a warm process that compiles nothing and loads the whole stored function,
the JSON and the markdown written. The architectures themselves are bench/hf.py's and the
model matrix's (tests/models/test_matrix.py); the harness is the point here."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench import survey
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("hf-llama", "hf-bert")


def test_whole_stored_reads_the_routes_log() -> None:
    assert survey.whole_stored({"log": ["INFO fcache: created the signing key"]}) == (
        "function",
        None,
    )
    package = ["INFO fcache: not captured whole (x); storing Dynamo's package of its frames"]
    assert survey.whole_stored({"log": package}) == ("package", None)
    declined = [*package, "INFO fcache: graph-broken function not stored (TypeError: no)"]
    assert survey.whole_stored({"log": declined}) == (
        "declined",
        "fcache: graph-broken function not stored (TypeError: no)",
    )


def test_two_families_cold_then_warm(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    proc = fresh.run(
        [sys.executable, "-m", "bench.survey", "--families", ",".join(FAMILIES),
         "--executors", "text", "--layers", "1", "--dim", "32", "--heads", "2", "--seq", "8",
         "--jobs", "2", "--timeout", "240", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "survey.json").read_text())
    assert doc["complete"] and doc["versions"]["transformers"]
    assert [r["family"] for r in doc["results"]] == list(FAMILIES)
    for result in doc["results"]:
        cold, warm = result["cold"], result["warm"]
        for report in (cold, warm):
            assert report["grad_error"] < 1e-4 and report["inference_error"] < 1e-4
            got, expected = report["losses"][0]
            assert got == pytest.approx(expected, rel=1e-5)
        assert cold["stats"]["compiles"] == cold["stats"]["unique_regions"] > 0
        assert warm["stats_total"]["compiles"] == 0
        assert warm["stats"]["functions_loaded"] == 1  # the whole training step, no Dynamo
        assert not warm["graph_breaks"]
        assert result["verdict"]["ok"]
    md = (tmp_path / "survey.md").read_text()
    for family in FAMILIES:
        line = next(x for x in md.splitlines() if x.startswith(f"| {family} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == "yes"
        assert cells[6] == "function / loaded"
        assert cells[7] == "0"  # warm compiles
        assert line in proc.stdout
    assert "2 of 2 families correct" in md
