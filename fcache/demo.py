"""`fcache demo`: the built-in Llama-style model, cold then warm, each in a fresh process,
next to torch.compile cold and warm, as a small table.

Every run is a new Python process (`python -m fcache.examples.run`), so "warm" means what it
means for a user: a new process finding a cache on disk, with nothing in memory. Cold runs
get empty cache directories (fcache's and Inductor's); warm runs reuse them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True)
class DemoConfig:
    layers: tuple[int, ...] = (2,)
    family: str = "llama"
    dim: int = 64
    heads: int = 4
    batch: int = 2
    seq: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    torch_compile: bool = True
    executors: str | None = None


def run_one(system: str, layers: int, cfg: DemoConfig, env: dict[str, str]) -> dict[str, Any]:
    """One fresh process; its JSON report, or {"error": ...} if it failed."""
    cmd = [
        sys.executable, "-m", "fcache.examples.run", "--system", system,
        "--layers", str(layers), "--family", cfg.family, "--dim", str(cfg.dim),
        "--heads", str(cfg.heads), "--batch", str(cfg.batch), "--seq", str(cfg.seq),
        "--device", cfg.device, "--dtype", cfg.dtype, "--check",
    ]  # fmt: skip
    if cfg.executors and system == "fcache":
        cmd += ["--executors", cfg.executors]
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}"}
    return dict(json.loads(lines[-1]))


def run_demo(cfg: DemoConfig, out: TextIO = sys.stdout) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    systems = ["fcache"] + (["torch.compile"] if cfg.torch_compile else [])
    out.write(_title(cfg))
    out.write(_header())
    with tempfile.TemporaryDirectory(prefix="fcache-demo-") as tmp:
        for layers in cfg.layers:
            for system in systems:
                dirs = Path(tmp) / f"{system}-{layers}"
                env = _env(dirs)
                for cache in ("empty", "warm"):
                    if cache == "warm":  # Inductor's own cache stays cold for fcache's warm run
                        env["TORCHINDUCTOR_CACHE_DIR"] = os.fspath(
                            dirs / ("inductor" if system != "fcache" else "inductor-2")
                        )
                    row = {"system": system, "layers": layers, "cache": cache}
                    row.update(run_one(system, layers, cfg, env))
                    rows.append(row)
                    out.write(_format(row))
                    out.flush()
    return rows


def _env(dirs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["FCACHE_DIR"] = os.fspath(dirs / "fcache")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.fspath(dirs / "inductor")
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    return env


def _title(cfg: DemoConfig) -> str:
    return (
        f"fcache demo: {cfg.family}-style decoder, d={cfg.dim}, {cfg.heads} heads, "
        f"batch {cfg.batch}x{cfg.seq} tokens, {cfg.dtype} on {cfg.device}; "
        "one training step (forward + backward) per fresh process\n\n"
    )


_COLUMNS = (
    "layers",
    "system",
    "cache",
    "first step",
    "steady step",
    "compiles",
    "unique",
    "max |err|",
)
_WIDTHS = (6, 14, 6, 11, 12, 9, 7, 0)


def _header() -> str:
    line = "  ".join(c.ljust(w) if w else c for c, w in zip(_COLUMNS, _WIDTHS, strict=True))
    return line + "\n" + "-" * 76 + "\n"


def _format(row: dict[str, Any]) -> str:
    err = row.get("max_abs_error")
    cells: Sequence[str] = (
        str(row["layers"]),
        row["system"],
        row["cache"],
        f"{row['first_step_s']:.2f} s" if "first_step_s" in row else "-",
        f"{row['steady_step_s'] * 1e3:.1f} ms" if row.get("steady_step_s") else "-",
        str(row.get("compiles", "-")),
        str(row.get("unique_regions", "-")),
        row.get("error") or (f"{err:.1e}" if err is not None else ""),
    )
    return "  ".join(c.ljust(w) if w else c for c, w in zip(cells, _WIDTHS, strict=True)) + "\n"
