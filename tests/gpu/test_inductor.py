"""The Inductor (AOTInductor) executor on a GPU: a training step against eager, and a warm
process with an empty Inductor cache that runs no compiler (no nvcc, ptxas or g++).

Skipped without CUDA. Each run is a fresh process (tests/e2e/runner.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e.runner import assert_matches_eager, compiler_shims, env_for, run_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
CUDA = ("--device", "cuda", "--executors", "inductor,eager")


def test_float32_step_matches_eager_and_warm_process_builds_nothing(tmp_path: Path) -> None:
    cold = run_model(2, env_for(tmp_path / "fcache", tmp_path / "inductor"), *CUDA)
    # TF32 is off for float32 matmuls by default: only fusion reorders the arithmetic.
    assert_matches_eager(cold, tol=1e-3)
    assert cold["compiles"] == cold["unique_regions"] > 0
    assert cold["fallbacks"] == 0

    log = tmp_path / "compilers.log"
    env = env_for(tmp_path / "fcache", tmp_path / "fresh-inductor",
                  PATH=compiler_shims(tmp_path / "shims", log))  # fmt: skip
    warm = run_model(2, env, *CUDA)
    assert_matches_eager(warm, tol=1e-3)
    assert warm["compiles"] == 0
    assert warm["hits"] == {"local": cold["unique_regions"]}
    runs = log.read_text().splitlines() if log.exists() else []
    assert runs == [], f"compilers ran in a warm process: {runs[:5]}"


def test_bfloat16_step_matches_eager_within_bf16_tolerance(tmp_path: Path) -> None:
    report = run_model(
        2, env_for(tmp_path / "fcache", tmp_path / "inductor"), *CUDA, "--dtype", "bfloat16"
    )
    assert report["max_abs_error"] < 0.1, report
    assert report["max_grad_error"] < 0.1, report
    assert report["compiles"] == report["unique_regions"]
