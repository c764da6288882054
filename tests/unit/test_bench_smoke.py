"""The benchmark harness end to end, at smoke size: `python -m bench.run --smoke` runs real
fresh processes (eager, fcache cold/warm/with a warm server, two processes at once) and
writes the JSON, markdown and plot that the README's results come from."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import report
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_rows_ratios_and_table(tmp_path: Path) -> None:
    out = tmp_path / "results" / "smoke"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    proc = fresh.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.with_suffix(".json").read_text())

    assert doc["complete"] is True
    assert doc["command"].startswith("python -m bench.run --smoke")
    assert doc["machine"]["cores"] >= 1 and doc["versions"]["torch"]
    singles = [r for r in doc["rows"] if r["kind"] == "single"]
    measured = {r["system"]: r for r in singles if r["role"] == "measure"}
    assert sorted(measured) == ["eager", "fcache-cold", "fcache-server", "fcache-warm"]
    assert [r["system"] for r in singles if r["role"] == "prime"] == ["fcache-server"]
    for row in singles:
        assert "error" not in row, row
        assert row["first_step_s"] > 0 and row["steady_step_s"] > 0
        assert row["max_abs_error"] < 1e-4 and row["max_grad_error"] < 1e-4
    for name in ("fcache-cold", "fcache-warm", "fcache-server"):
        row = measured[name]
        assert row["executors"] == "eager" and row["compiles"] == 0
        assert row["unique_regions"] > 0
        # The split adds up to the first step by construction; each part is measured.
        parts = row["capture_s"] + row["compile_load_s"] + row["run_s"]
        assert abs(parts - row["first_step_s"]) < 1e-3
        assert row["compile_load_s"] > 0

    multis = {r["variant"]: r for r in doc["rows"] if r["kind"] == "multiproc"}
    assert sorted(multis) == ["fcache-independent", "fcache-server"]
    for row in multis.values():
        assert row["n"] == 2 and row["failed"] == 0 and len(row["processes"]) == 2
        assert 0 < row["max_first_step_s"] < row["wall_first_step_s"] <= row["wall_exit_s"]
        assert row["total_compiles"] == 0

    names = {(r["kind"], r["ratio"]) for r in doc["ratios"]}
    assert ("single", "fcache warm / fcache cold") in names
    assert ("single", "fcache server-warm / fcache cold") in names
    assert ("multiproc", "fcache-server / fcache-independent") in names
    assert all(r["same_run"] and r["value"] > 0 for r in doc["ratios"])
    assert doc["ratios"] == report.ratios(doc["rows"])

    table = out.with_suffix(".md").read_text()
    assert "| fcache-warm[eager] |" in table and "fcache-server / fcache-independent" in table
    assert out.with_suffix(".png").exists() == (importlib.util.find_spec("matplotlib") is not None)


def test_report_merges_pieces_and_marks_ratios_across_runs(tmp_path: Path) -> None:
    """Two pieces of a suite (as the GPU run is split) merge into one table; a ratio whose
    rows come from different pieces says so."""

    def piece(run_id: str, system: str, first: float) -> dict[str, object]:
        row = {
            "kind": "single",
            "family": "llama",
            "mode": "train",
            "layers": 16,
            "system": system,
            "executors": "nvfuser" if system.startswith("fcache") else None,
            "role": "measure",
            "run_id": run_id,
            "first_step_s": first,
            "steady_step_s": 0.02,
        }
        return {
            "command": f"python -m bench.run --systems {system}",
            "config": {"device": "cuda", "shape": {"dim": 1024}},
            "machine": {"cpu": "x", "cores": 16, "gpus": [{"name": "H200"}], "hostname": run_id},
            "versions": {"torch": "2.11"},
            "complete": True,
            "rows": [row],
        }

    a, b = piece("a", "torch.compile-cold", 20.0), piece("b", "fcache-cold", 5.0)
    merged = report.merge([a, b])
    assert len(merged["rows"]) == 2 and len(merged["commands"]) == 2
    (ratio,) = [r for r in report.ratios(merged["rows"]) if r["metric"] == "first_step_s"]
    assert ratio["ratio"] == "fcache cold / torch.compile cold"
    assert ratio["value"] == 0.25 and ratio["same_run"] is False
    assert "(different runs)" in report.markdown(merged)
    assert "PYTHONDONTWRITEBYTECODE" not in report.markdown(merged)
    merged["machine"] = {**merged.get("machine", {}), "bytecode_written": False}
    assert "PYTHONDONTWRITEBYTECODE was set" in report.markdown(merged)
    # Rows that measured the compile call too are compared on it (start_s), not the step.
    for piece_doc, start in ((a, 24.0), (b, 6.0)):
        piece_doc["rows"][0]["start_s"] = start  # type: ignore[index]
    found = report.ratios(report.merge([a, b])["rows"])
    (ratio,) = [r for r in found if r["ratio"] == "fcache cold / torch.compile cold"]
    assert ratio["metric"] == "start_s" and ratio["value"] == 0.25
    other = piece("c", "eager", 1.0)
    other["versions"] = {"torch": "2.13"}
    try:
        report.merge([a, other])
    except ValueError as exc:
        assert "versions" in str(exc)
    else:
        raise AssertionError("pieces with different versions were merged")


def test_report_splices_readme_between_markers(tmp_path: Path) -> None:
    doc = {
        "command": "python -m bench.run --device cuda",
        "config": {"device": "cuda", "shape": {"dim": 1024}},
        "machine": {"cpu": "x", "cores": 16, "gpus": [{"name": "H200"}]},
        "versions": {"torch": "2.11"},
        "rows": [
            {
                "kind": "single",
                "family": "llama",
                "mode": "train",
                "layers": 16,
                "system": "eager",
                "role": "measure",
                "start_s": 2.0,
                "first_step_s": 1.5,
                "steady_step_s": 0.04,
            }
        ],
    }
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n\n## Results\n\n<!-- results:start -->\nold\n<!-- results:end -->\n\nend\n"
    )
    prefix = tmp_path / "bench" / "results" / "gpu"
    prefix.parent.mkdir(parents=True)
    prefix.with_suffix(".png").write_bytes(b"png")
    report.splice_readme(readme, doc, prefix)
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- results:end -->\n\nend\n")
    assert "![start against depth](bench/results/gpu.png)" in text
    assert "### fcache benchmark: cuda" in text and "#### First step" in text
    assert "| llama | train | 16 | eager | 2.00 s | 1.50 s |" in text


def _bench(module: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")} | extra
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return fresh.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_steady_ab_keeps_the_rounds_that_fit_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "budget"
    proc = _bench("bench.steady_ab", "--rounds", "3", "--steps", "2", "--layers", "1",
                  "--budget", "0.001", "--system", "eager", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["rounds"] == 1  # the first round always runs; no second fits
    assert len(result["summary"]["eager"]["processes_ms"]) == 1
    assert "budget: 1 of 3 rounds" in proc.stderr
    assert "1 rounds." in out.with_suffix(".md").read_text()


def test_steady_ab_alternates_fresh_processes_labels_versions_and_never_primes_a_cold_one(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other"  # "another version": here the same package, copied
    subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD", "fcache", "-o",
                    str(tmp_path / "fcache.tar")], check=True)  # fmt: skip
    other.mkdir()
    subprocess.run(["tar", "-x", "-f", str(tmp_path / "fcache.tar"), "-C", str(other)],
                   check=True)  # fmt: skip
    out = tmp_path / "ab"
    proc = _bench("bench.steady_ab", "--rounds", "2", "--steps", "3", "--layers", "1",
                  "--system", "eager", "--system", f"eager@{other}", "--system", "eager:cold",
                  "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    assert sorted(summary) == ["eager", "eager:cold", "eager@other"]  # a folder's name, not path
    assert summary["eager"]["ratio"] == 1.0
    for row in summary.values():
        assert len(row["processes_ms"]) == 2 and row["min_ms"] <= row["median_ms"] <= row["max_ms"]
    # The warm systems are primed (their caches filled first); a cold one never is: every
    # process of it starts empty.
    assert summary["eager"]["cold_process_ms"] > 0 and summary["eager@other"]["cold_process_ms"] > 0
    assert "cold_process_ms" not in summary["eager:cold"]
    primed = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("cold ")]
    assert len(primed) == 2 and not any("eager:cold" in line for line in primed), primed
    assert proc.stderr.count("round 1") == 3
    md = out.with_suffix(".md").read_text()
    assert "| eager:cold |" in md and str(tmp_path) not in md  # command line included


def test_cold_ab_starts_every_process_with_empty_caches(tmp_path: Path) -> None:
    out = tmp_path / "cold"
    # fcache's regions in eager: the processes still capture and cut the model (seconds),
    # without Inductor's C++ builds (a minute a process on 2 cores), which are not the point.
    proc = _bench("bench.steady_ab", "--cold", "--rounds", "2", "--steps", "1", "--layers", "1",
                  "--system", "eager", "--system", "fcache", "--out", str(out),
                  "--executors", "eager")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    assert "cold" not in proc.stderr  # no priming process
    assert proc.stderr.count("start") == 4
    # A warm fcache process loads a stored function in well under a second on this model;
    # both of these compiled (the second found nothing of the first's).
    assert min(summary["fcache"]["processes_s"]) > 2.0
    assert summary["eager"]["max_s"] < summary["fcache"]["min_s"]
    assert "ratio to eager" in out.with_suffix(".md").read_text()


def test_unchecked_ab_times_each_graph_both_ways(tmp_path: Path) -> None:
    cache = tmp_path / "fcache"
    inductor = str(tmp_path / "inductor")
    proc = _bench("bench.unchecked_ab", "--layers", "1", "--repeats", "3",
                  FCACHE_DIR=str(cache), TORCHINDUCTOR_CACHE_DIR=inductor)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert len(doc["graphs"]) == 2  # forward and backward
    for graph in doc["graphs"]:
        assert graph["regions"] > 0 and graph["unchecked_us"] > 0 and graph["checked_us"] > 0
    assert any(cache.iterdir())  # its regions went to the cache it was given


def test_processes_started_together_are_told_they_share_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import launch

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # the caller's own: never passed on
    caches = launch.Caches(fcache=tmp_path / "f", inductor=tmp_path / "i")
    assert "LOCAL_WORLD_SIZE" not in launch.environment(caches)
    assert launch.environment(caches, local_ranks=4)["LOCAL_WORLD_SIZE"] == "4"


def test_norm_bench_times_each_system_in_its_own_process(tmp_path: Path) -> None:
    out = tmp_path / "norm"
    proc = _bench("bench.norm", "--device", "cpu", "--rows", "256", "--dim", "32",
                  "--dtype", "float32", "--steps", "2",
                  "--systems", "eager,fcache-cold,fcache-warm", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["system"]: r for r in json.loads(out.with_suffix(".json").read_text())}
    assert list(rows) == ["eager", "fcache-cold", "fcache-warm"]
    for row in rows.values():
        assert row["steady_ms"] > 0 and row["bytes_per_step"] == 5 * 256 * 32 * 4
    # The warm process found what the cold one compiled: its first step is no compile.
    assert rows["fcache-warm"]["first_s"] < rows["fcache-cold"]["first_s"] / 4
    assert "| fcache-warm |" in out.with_suffix(".md").read_text()
