"""Plain torch.compile with fcache-server as its remote cache (`fcache.share_torch_compile`):
the first step of a second process, against torch.compile cold and warm.

    python -m bench.torch_share                 # saved as bench/results/torch_share-<device>.*
    python -m bench.torch_share --layers 2 --repeat 3 --device cuda --out DIR

One real fcache-server (`python -m service.main`) on a fresh store. Each row is a fresh
process running the example decoder (`python -m fcache.examples.run --system
torch.compile`, one training step, then steady steps) with its own empty Inductor cache
directory unless the row says otherwise:

- cold: torch.compile alone, empty local cache, no server (what every rank pays today);
- cold, sharing: the same with `share_torch_compile()`: compiles and puts its entries;
- second process, sharing: empty local cache, the server filled by the row above (another
  rank, node or job);
- warm local: torch.compile alone, reusing the cold row's local cache (torch's best case,
  on the machine that compiled).

Compiler runs (g++, nvcc, ptxas...) of each process are counted through PATH shims, and
Inductor's counters (FX graphs compiled and found) come from the runner's report. With
--repeat N, every row runs N times (alternating) and the table shows the median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.machine import machine, versions

ROOT = Path(__file__).resolve().parents[1]
COMPILERS = ("g++", "gcc", "c++", "cc", "clang", "clang++", "nvcc", "ptxas")
ROWS = ("cold", "cold, sharing", "second process, sharing", "warm local")
# The runner, with share_torch_compile() first when FCACHE_SERVER is set.
_RUN = (
    "import os, sys, fcache\n"
    "if os.environ.get('FCACHE_SERVER'): fcache.share_torch_compile()\n"
    "from fcache.examples.run import main\n"
    "main(sys.argv[1:])\n"
)


@contextmanager
def server(work: Path) -> Iterator[str]:
    """A fresh fcache-server on a Unix socket; its address."""
    ready = work / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    process = subprocess.Popen(
        [sys.executable, "-m", "service.main", "--db", str(work / "db"),
         "--listen", f"unix:{work / 'fcache.sock'}", "--ready-file", str(ready)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("fcache-server did not start")
            time.sleep(0.05)
        yield json.loads(ready.read_text())["addresses"][0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def shims(directory: Path, log: Path) -> str:
    """A PATH whose compilers append a line to `log` per run, then run the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in COMPILERS:
        real = shutil.which(name)
        shim = directory / name
        target = f'exec "{real}" "$@"' if real else "exit 127"
        shim.write_text(f'#!/bin/sh\necho "{name}" >> "{log}"\n{target}\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '')}"


def run_row(
    args: argparse.Namespace, inductor_dir: Path, address: str | None, work: Path
) -> dict[str, Any]:
    log = work / f"compilers-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FCACHE_", "TORCHINDUCTOR_"))}
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(inductor_dir),
        PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        PATH=shims(work / "bin", log),
    )
    if address:
        env["FCACHE_SERVER"] = address
    command = [sys.executable, "-c", _RUN, "--system", "torch.compile",
               "--layers", str(args.layers), "--dim", str(args.dim), "--device", args.device,
               "--steps", "3"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    runs = log.read_text().splitlines() if log.exists() else []
    return {
        "first_step_s": report["first_step_s"],
        "steady_step_s": report["steady_step_s"],
        "process_s": round(wall, 2),
        "graphs_compiled": report["compiles"],
        "graphs_found": report["graph_cache_hits"],
        "compiler_runs": len(runs),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory(prefix="fcache-torch-share-") as tmp:
        for i in range(args.repeat):
            work = Path(tmp) / f"round{i}"
            work.mkdir()
            with server(work) as address:
                rows["cold"].append(run_row(args, work / "ind-cold", None, work))
                rows["cold, sharing"].append(run_row(args, work / "ind-a", address, work))
                rows["second process, sharing"].append(run_row(args, work / "ind-b", address, work))
                rows["warm local"].append(run_row(args, work / "ind-cold", None, work))
            for name in ROWS:
                print(f"round {i}: {name}: {rows[name][-1]}", file=sys.stderr, flush=True)
    return rows


def table(rows: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| process | first step | steady step | FX graphs compiled / found | compiler runs |",
        "|---|---|---|---|---|",
    ]
    for name in ROWS:
        runs = [r for r in rows[name] if "error" not in r]
        if not runs:
            lines.append(f"| {name} | failed | | | |")
            continue

        def median(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        firsts = ", ".join(f"{r['first_step_s']:.1f}" for r in runs)
        lines.append(
            f"| {name} | {median('first_step_s'):.1f} s ({firsts}) "
            f"| {median('steady_step_s') * 1e3:.1f} ms "
            f"| {median('graphs_compiled'):.0f} / {median('graphs_found'):.0f} "
            f"| {median('compiler_runs'):.0f} |"
        )
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """The Markdown report of a saved result."""
    config, info = result["config"], result["machine"]
    loads = [r["loadavg_1m"] for rows in result["rows"].values() for r in rows if "loadavg_1m" in r]
    return (
        "# torch.compile with fcache-server as its remote cache\n\n"
        f"`{result['command']}`, {result['started']}. Machine: {info['cores']} cores "
        f"({info['cpu']}); torch {result['versions']['torch']}. Llama-style decoder from "
        f"`fcache/examples`, {config['layers']} layers, d={config['dim']}, one training step; "
        f"each row a fresh process; medians of {config['repeat']} rounds (each round's value "
        "in parentheses). Raw numbers: the .json beside this file.\n\n"
        + table(result["rows"])
        + "\n\nReading it: the second process finds both FX graphs (forward, backward) and the "
        "AOTAutograd entry on the server and lowers nothing, but on CPU an FX entry carries "
        "C++ source, not built libraries: Inductor runs the same compiler jobs as a cold "
        "process (the compiler-run column), and those dominate a CPU compile. A warm local "
        "cache also keeps the built libraries, hence its few compiler runs (the vector-ISA "
        "probes). On CUDA the entries carry the Triton kernels themselves "
        "(tests/gpu/test_share_torch_compile.py).\n"
        + (
            f"\nOther work on the machine: load average (1 min) {min(loads)} to {max(loads)} "
            f"on {info['cores']} cores while the rows ran, so the seconds are inflated and "
            "noisy; the counts are not.\n"
            if loads and max(loads) > info["cores"]
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--render", type=Path, help="rewrite the .md of a saved .json, run nothing")
    args = p.parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(render(result))
        return 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = measure(args)
    command = "python -m bench.torch_share " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": command.strip(),
        "started": started,
        "config": {k: str(v) for k, v in vars(args).items() if k not in ("out", "render")},
        "machine": machine(),
        "versions": versions(),
        "rows": rows,
    }
    name = f"torch_share-{args.device.split(':')[0]}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = render(result)
    (args.out / f"{name}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
