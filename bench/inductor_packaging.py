"""Inductor's packaging routes for one region, side by side in one run.

    python -m bench.inductor_packaging [--device cpu|cuda] [--regions 4]

Route A: torch._inductor.standalone_compile + CompiledArtifact.save/load.
Route B: AOTInductor, aoti_compile_and_package + the package loader, Inductor's defaults.
Route B': the same with the options fcache's Inductor executor compiles with
(fcache.executors.inductor.options: on CUDA, no CPU vector-ISA probe, no precompiled header).
Route C: fcache's default, Inductor's Python wrapper with its built kernels
(fcache.executors.inductor_python: compile_payload, load_payload).

For each route: compile time per region (in one process, after a first warm-up region),
artifact size, and then, in a FRESH process with an EMPTY Inductor cache directory (a new
machine that got the artifacts from a server): load time per region, the number of
compiler processes that ran (g++/nvcc/ptxas via PATH shims), and the per-call overhead of
a loaded region. Writes bench/results/inductor_packaging-<device>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# Regions of the kinds a transformer block produces (norm, activation, residual, softmax).
_REGIONS = [
    "lambda x, w: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w,)",
    "lambda x, w: (torch.nn.functional.silu(x) * w,)",
    "lambda x, w: (torch.tanh(x) + w, x.sum(0))",
    "lambda x, w: (torch.softmax(x * w, dim=-1),)",
    "lambda x, w: (torch.exp(x) * w + 1,)",
    "lambda x, w: (torch.nn.functional.gelu(x + w),)",
]

_COMPILE = r"""
import sys, time, json, torch
from torch.fx.experimental.proxy_tensor import make_fx
route, device, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fns = [eval(src) for src in json.loads(sys.argv[5])][:n]
x = torch.randn(64, 256, device=device); w = torch.randn(256, device=device)
times, sizes = [], []
for i, f in enumerate(fns):
    gm = make_fx(f)(x, w)
    start = time.perf_counter()
    path = f"{out}/r{i}." + ("bin" if route in ("standalone", "python") else "pt2")
    if route == "python":
        from fcache.executors.inductor_python import compile_payload
        with open(path, "wb") as f:
            f.write(compile_payload(gm, (x, w), (x, w), torch.device(device)))
    elif route == "standalone":
        art = torch._inductor.standalone_compile(
            gm, [x, w], dynamic_shapes="from_example_inputs", options={})
        art.save(path=path, format="binary")
    else:
        from fcache.executors.inductor import options
        configs = options(device) if route == "aoti-fcache" else {}
        ep = torch.export.export(gm, (x, w), strict=False)
        torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=configs)
    times.append(time.perf_counter() - start)
    import os; sizes.append(os.path.getsize(path))
print(json.dumps({"compile_s": times, "bytes": sizes}))
"""

_LOAD = r"""
import sys, time, json, torch
route, device, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
x = torch.randn(64, 256, device=device); w = torch.randn(256, device=device)
start = time.perf_counter()
if route == "python":
    import threading
    from fcache.executors.inductor_python import load_payload
    lock, idx = threading.Lock(), 0 if device == "cuda" else -1
    fns = [load_payload(open(f"{out}/r{i}.bin", "rb").read(), device, idx, lock) for i in range(n)]
    call = lambda f: f([x, w])
elif route == "standalone":
    from torch._inductor import CompiledArtifact
    fns = [CompiledArtifact.load(path=f"{out}/r{i}.bin", format="binary") for i in range(n)]
    call = lambda f: f(x, w)
else:
    idx = 0 if device == "cuda" else -1
    load = torch._C._aoti.AOTIModelPackageLoader
    fns = [load(f"{out}/r{i}.pt2", "model", False, 1, idx).boxed_run for i in range(n)]
    call = lambda f: f([x, w])
for f in fns: call(f)
if device == "cuda": torch.cuda.synchronize()
load = time.perf_counter() - start
f = fns[-1]
for _ in range(50): call(f)
if device == "cuda": torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(2000): call(f)
if device == "cuda": torch.cuda.synchronize()
per_call = (time.perf_counter() - start) / 2000
print(json.dumps({"load_total_s": load, "call_us": per_call * 1e6}))
"""

COMPILERS = ("g++", "gcc", "c++", "cc", "nvcc", "ptxas")


def _shims(directory: Path, log: Path) -> str:
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    for name in COMPILERS:
        real = shutil.which(name)
        shim = directory / name
        shim.write_text(
            f'#!/bin/sh\necho "{name}" >> "{log}"\n'
            + (f'exec "{real}" "$@"\n' if real else "exit 127\n")
        )
        shim.chmod(0o755)
    return f"{directory}{os.pathsep}{os.environ['PATH']}"


def _run(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(route: str, device: str, n: int, tmp: Path) -> dict[str, Any]:
    out = tmp / route
    out.mkdir()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"{route}-inductor")}
    built = _run(_COMPILE, [route, device, str(n + 1), str(out), json.dumps(_REGIONS)], env)
    log = tmp / f"{route}-compilers.log"
    fresh = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"{route}-fresh"),
        "PATH": _shims(tmp / f"{route}-shims", log),
    }
    loaded = _run(_LOAD, [route, device, str(n + 1), str(out)], fresh)
    runs = log.read_text().splitlines() if log.exists() else []
    return {
        "route": route,
        # The first region pays one-time costs (precompiled header, ISA probe): reported apart.
        "first_compile_s": built["compile_s"][0],
        "compile_s_per_region": sum(built["compile_s"][1:]) / n,
        "bytes_per_region": sum(built["bytes"]) / (n + 1),
        "fresh_load_s_per_region": loaded["load_total_s"] / (n + 1),
        "fresh_load_compiler_runs": len(runs),
        "call_us": loaded["call_us"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--regions", type=int, default=4)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory(prefix="fcache-bench-") as tmp:
        rows = [
            measure(route, args.device, args.regions, Path(tmp))
            for route in ("standalone", "aoti", "aoti-fcache", "python")
        ]
    result = {
        "command": "python -m bench.inductor_packaging " + " ".join(sys.argv[1:]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        },
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"inductor_packaging-{args.device}.json").write_text(
        json.dumps(result, indent=2) + "\n"
    )
    print(
        f"{'route':<11} {'first compile':>14} {'compile/region':>15} {'bytes/region':>13} "
        f"{'fresh load/region':>18} {'compiler runs':>14} {'call':>9}"
    )
    for r in rows:
        print(
            f"{r['route']:<11} {r['first_compile_s']:>12.2f} s "
            f"{r['compile_s_per_region']:>13.2f} s "
            f"{r['bytes_per_region']:>13,.0f} "
            f"{r['fresh_load_s_per_region'] * 1e3:>15.1f} ms {r['fresh_load_compiler_runs']:>14} "
            f"{r['call_us']:>6.1f} us"
        )


if __name__ == "__main__":
    main()
