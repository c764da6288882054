"""Run the example model in a fresh process, as a user's training script would."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from tests import fresh

ROOT = Path(__file__).resolve().parents[2]
# The test model: small enough to compile in about a minute on two cores, big enough to
# have every kind of region a Llama block produces (RMSNorm, RoPE, SwiGLU, residuals).
MODEL_ARGS = ["--family", "llama", "--dim", "32", "--heads", "2", "--vocab", "64",
              "--batch", "2", "--seq", "8", "--steps", "1", "--check"]  # fmt: skip
COMPILERS = ("g++", "gcc", "c++", "cc", "clang", "clang++", "nvcc", "ptxas")


def env_for(cache_dir: Path, inductor_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FCACHE_DIR=os.fspath(cache_dir),
        TORCHINDUCTOR_CACHE_DIR=os.fspath(inductor_dir),
        # This checkout first; keep what the environment adds (site dirs of a GPU set-up).
        PYTHONPATH=os.pathsep.join(p for p in (os.fspath(ROOT), os.environ.get("PYTHONPATH")) if p),
        FCACHE_PROGRESS="0",
    )
    env.update(extra)
    return env


def command(layers: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "fcache.examples.run", "--system", "fcache",
            "--layers", str(layers), *MODEL_ARGS, *args]  # fmt: skip


def run_model(layers: int, env: dict[str, str], *args: str, timeout: float = 900) -> dict[str, Any]:
    proc = fresh.run(
        command(layers, *args), env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def parse_report(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def compiler_shims(directory: Path, log: Path) -> str:
    """A PATH prefix whose compilers log each run to `log`, then run the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in COMPILERS:
        real = shutil.which(name)
        shim = directory / name
        target = f'exec "{real}" "$@"' if real else "exit 127"
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{target}\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


def assert_matches_eager(report: dict[str, Any], tol: float = 1e-4) -> None:
    assert report["max_abs_error"] <= tol, report
    assert report["max_grad_error"] <= tol, report
