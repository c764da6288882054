"""The distributed benchmark end to end at smoke size (issue #44): `python -m bench.distributed
--nproc 2 --smoke` runs real torchrun jobs of two gloo ranks on the CPU (FSDP2 here; DDP is
exercised through fcache by tests/distributed), torch.compile (its capture only, aot_eager)
and fcache (the text executor, a real fcache-server), cold and warm, and writes the JSON
and markdown the GPU results come from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_reports_ranks_compiles_per_node_and_ratios(tmp_path: Path) -> None:
    out = tmp_path / "results" / "dist"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    command = [
        sys.executable, "-m", "bench.distributed", "--nproc", "2", "--smoke", "--wraps", "fsdp2",
        "--out", str(out), "--work", str(tmp_path / "work"),
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:] + _failed_jobs_stderr(tmp_path / "work")
    doc = json.loads(out.with_suffix(".json").read_text())

    assert doc["complete"] is True and doc["kind"] == "distributed"
    assert doc["command"].startswith("python -m bench.distributed --nproc 2 --smoke")
    rows = {(r["system"], r["phase"]): r for r in doc["rows"]}
    assert sorted(rows) == [
        ("fcache", "cold"), ("fcache", "warm"), ("torch.compile", "cold"), ("torch.compile", "warm")
    ]  # fmt: skip
    for row in rows.values():
        assert "error" not in row, row
        assert row["wrap"] == "fsdp2" and row["nproc"] == 2
        assert sorted(r["rank"] for r in row["ranks"]) == [0, 1]
        assert row["start_s"] >= row["fastest_start_s"] > 0
        assert row["steady_step_s"] > 0 and row["first_step_spread_s"] >= 0
        assert row["command"].startswith("torchrun --standalone --nproc-per-node 2")
        # --check: one more step against FSDP2 without compiling, gradients gathered whole.
        assert row["loss_error"] < 1e-5 and row["max_grad_error"] < 1e-5
    cold, warm = rows["fcache", "cold"], rows["fcache", "warm"]
    # The two ranks compiled each unique region once between them, through the server...
    assert cold["node_compiles"] == cold["unique_regions"] > 0
    # ...and the second job, on the same caches, compiled nothing.
    assert warm["node_compiles"] == 0 and warm["unique_regions"] == cold["unique_regions"]
    assert all(r["errors"] == {} for r in cold["ranks"] + warm["ranks"])

    names = {r["ratio"] for r in doc["ratios"]}
    assert names == {
        "fcache cold / torch.compile cold",
        "fcache warm / torch.compile warm",
        "fcache steady / torch.compile steady",
    }
    assert all(r["value"] > 0 for r in doc["ratios"])
    table = out.with_suffix(".md").read_text()
    assert "| hf-llama | fsdp2 | fcache[text,eager] | cold |" in table
    assert "### Per rank" in table and "fcache cold / torch.compile cold" in table


def _failed_jobs_stderr(work: Path) -> str:
    """The stderr of every job, for the failure message: the bench's own line holds only the
    rank's last exception."""
    return "".join(
        f"\n--- {path.parent.name}\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(work.glob("logs/*/stderr.txt"))
    )
