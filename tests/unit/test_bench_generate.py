"""bench.generate end to end at smoke size: fresh processes (fcache cold, then warm from its
cache with an empty Inductor cache), rows with tokens per second and compile counts, the
JSON and the markdown table written. Two new tokens (the prefill and one decode step,
regions in eager): the harness is the point here (bounded compiles over many tokens are
tests/unit/engine/test_generate.py's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench.generate import agreement, pooled, table
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


def test_agreement_counts_tokens_before_the_first_difference() -> None:
    assert agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == 1.0
    assert agreement([[1, 9, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == pytest.approx(4 / 6)


def test_rounds_are_pooled_call_by_call_and_compared_by_their_medians() -> None:
    """Several rounds: every call after the first of every round counts once, and the
    ratio is of the pooled medians, not of one process against another."""

    def row(system: str, round_: int, calls: list[float]) -> dict[str, object]:
        return {"system": system, "batch": 2, "round": round_, "calls_s": calls,
                "tokens_per_s": 2 * 4 / sorted(calls)[len(calls) // 2], "tokens": [[1] * 4] * 2,
                "decode_tokens_per_s": 1.0, "first_token_s": 1.0, "first_call_s": 1.0,
                "compiled_first_call": {"dynamo_graphs": 1, "fx_graph_misses": 1},
                "compiled_after_first": {}}  # fmt: skip

    results = [
        row("torch.compile-ro", 1, [0.40, 0.42, 0.44]),
        row("fcache-cg-cold", 1, [0.30, 0.31, 0.32]),
        row("torch.compile-ro", 2, [0.20, 0.21, 0.22]),
        row("fcache-cg-cold", 2, [0.50, 0.51, 0.52]),
    ]
    summary = pooled(results)
    ro, cold = summary[(2, "torch.compile-ro")], summary[(2, "fcache-cg-cold")]
    assert (ro["rounds"], ro["calls"]) == (2, 6)
    assert ro["median_call_s"] == pytest.approx((0.22 + 0.40) / 2)
    assert cold["median_call_s"] == pytest.approx((0.32 + 0.50) / 2)
    assert cold["tokens_per_s"] == pytest.approx(8 / 0.41)
    text = table(results)
    assert "| 2 | fcache-cg-cold (round 2) |" in text  # each round's own row, against its round
    ratio = ro["median_call_s"] / cold["median_call_s"]
    assert f"| {ratio:.2f}x torch.compile-ro |" in text


def test_smoke_run_writes_rows_and_table(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "generate.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    proc = fresh.run(
        [sys.executable, "-m", "bench.generate", "--smoke", "--systems", "fcache-cold,fcache-warm",
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["complete"]
    cold, warm = doc["results"]
    assert [cold["system"], warm["system"]] == ["fcache-cold", "fcache-warm"]
    for result in (cold, warm):
        assert result["tokens_per_s"] > 0 and result["first_token_s"] > 0
        assert len(result["tokens"]) == 1 and len(result["tokens"][0]) == 2
        assert sum(result["compiled_after_first"].values()) == 0  # nothing after the first call
    assert cold["tokens"] == warm["tokens"]
    assert cold["compiled_first_call"]["graphs"] == 2
    assert warm["compiled_first_call"]["region_compiles"] == 0
    assert warm["compiled_first_call"]["programs_loaded"] == 2
    assert "| 1 | fcache-warm |" in out.with_suffix(".md").read_text()
