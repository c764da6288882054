"""One fused norm, forward and backward: is fcache's kernel as fast as torch.compile's?

    python -m bench.norm --device cuda                       # 576000 x 384, bfloat16
    python -m bench.norm --device cuda --rows 4096 --dim 1024 --out OUT/norm

Hugging Face's LlamaRMSNorm (float32 statistics, weight applied in the input's dtype) on
one `rows x dim` tensor; a step is its forward and its backward with a fixed output
gradient (`torch.autograd.backward(y, g)`, no loss kernel), gradients of x and w set to
None before each. Each system runs in a fresh process: eager, torch.compile (default),
fcache cold (empty cache) and fcache warm (a new process on that cache). Each prints its
first step (compile included) and its steady step: the median over 5 timings of 20 steps
(CUDA events), with the bytes a step must move at least (x read twice, g and w read, y
and dx written: 5 x rows x dim x itemsize) and that over the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SYSTEMS = ("eager", "torch.compile", "fcache-cold", "fcache-warm")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LlamaRMSNorm.forward (transformers), as a function of the input and the weight."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return w * hidden.to(x.dtype)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Measure one system in this process."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.rows, args.dim, device=device, dtype=dtype, generator=gen)
    w = torch.randn(args.dim, device=device, dtype=dtype, generator=gen)
    g = torch.randn(args.rows, args.dim, device=device, dtype=dtype, generator=gen)
    x.requires_grad_(True)
    w.requires_grad_(True)
    system = args.child
    if system == "eager":
        fn = rms_norm
    elif system == "torch.compile":
        fn = torch.compile(rms_norm)
    else:
        import fcache

        fn = fcache.jit(rms_norm)

    def step() -> None:
        x.grad = w.grad = None
        torch.autograd.backward(fn(x, w), g)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - start
    for _ in range(5):
        step()
    sync()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        runs.append((time.perf_counter() - start) / args.steps)
    steady = statistics.median(runs)
    moved = 5 * args.rows * args.dim * x.element_size()
    return {
        "system": system,
        "first_s": round(first, 3),
        "steady_ms": round(steady * 1e3, 4),
        "steady_range_ms": [round(min(runs) * 1e3, 4), round(max(runs) * 1e3, 4)],
        "bytes_per_step": moved,
        "gb_per_s": round(moved / steady / 1e9, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", type=int, default=576000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    p.add_argument("--child", choices=("eager", "torch.compile", "fcache"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(SYSTEMS):
        p.error(f"unknown systems {sorted(unknown)}: choose from {', '.join(SYSTEMS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="fcache-norm-") as tmp:
        for system in systems:
            kind = system.split("-")[0]
            env = {**os.environ, "FCACHE_DIR": os.path.join(tmp, "fcache"),
                   "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, f"inductor-{kind}"),
                   "TRITON_CACHE_DIR": os.path.join(tmp, f"triton-{kind}")}  # fmt: skip
            shape = ["--rows", str(args.rows), "--dim", str(args.dim), "--dtype", args.dtype]
            command = [sys.executable, "-m", "bench.norm", "--child", kind, "--device",
                       args.device, *shape, "--steps", str(args.steps)]  # fmt: skip
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{system} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["system"] = system
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = next((r["steady_ms"] for r in rows if r["system"] == "torch.compile"), None)
    lines = [
        f"`python -m bench.norm {' '.join(sys.argv[1:])}` ({_device_name(args.device)}, "
        f"torch {torch.__version__}, {args.rows} x {args.dim} {args.dtype})",
        "",
        "| system | first step | steady step | range | GB/s moved | to torch.compile |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['steady_ms'] / base:.3f}x" if base else "-"
        lo, hi = r["steady_range_ms"]
        lines.append(
            f"| {r['system']} | {r['first_s']:.2f} s | {r['steady_ms']:.3f} ms | "
            f"{lo:.3f}-{hi:.3f} | {r['gb_per_s']} | {ratio} |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return device


if __name__ == "__main__":
    main()
