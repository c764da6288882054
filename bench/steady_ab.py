"""Steady steps of warm processes, systems alternating: a ratio that holds on a noisy host.

One process's steady step on a shared or throttled host moves by 2x between processes
(bench/results/cpu-python-route-2026-11-25), so a single pair of processes settles nothing.
This runs each system first in a cold process (filling its caches; not counted), then
`--rounds` rounds of one fresh warm process per system, the order rotating every round,
and reports each system's median over processes of their median steady step, its spread,
and its ratio to the first system's; the cold process's own steady step is reported
apart (one process: a hint, not a ratio).

With `--cold` it compares cold starts instead: every process (no priming one) starts with
empty caches of its own (fcache, Inductor, Triton, the CUDA driver's: `bench.launch`) and
its `start_s` (the compile call and first step) is what is reported, in seconds. As in
`bench.run`, the caller's FCACHE_* settings do not reach those processes (only a system's
own, fcache-cudagraphs'); without `--cold` they do.

    python -m bench.steady_ab --device cpu --family llama --layers 8 --rounds 8 \\
        --system torch.compile --system fcache --system fcache@OLD --out OUT/steady-ab

Systems: those of `bench.measure` (torch.compile, torch.compile-reduce-overhead, fcache),
and fcache-cudagraphs (fcache with FCACHE_CUDA_GRAPHS=1, on fcache's cache).
A system named with `:cold` (`fcache:cold`) runs every process of its own with empty caches,
as `--cold` does, and reports its steady step: `--system torch.compile --system fcache:cold
--system fcache` alternates cold and warm fcache processes, the gap between their steady steps
measured on the same host at the same time (issue #16's warm-within-3%-of-cold).
`fcache@DIR` runs fcache from DIR (a folder holding another version's `fcache` package,
e.g. `git archive REV fcache | tar -x -C DIR`), with the same cache as `fcache`: an A/B of
two versions of the code (their keys must agree, or the first warm round compiles).
Every process is `python -m bench.measure` (see there for what it times).

`--budget SECONDS` starts no round that the longest round so far says would end past them,
so that a command with a time limit reports the rounds it could fit; the report (`--out`)
is written after every round, so a failed process or a killed command keeps those done.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import launch
from bench.run import _RUNNER_SYSTEM, _SYSTEM_ENV

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--system",
        action="append",
        required=True,
        help="torch.compile, torch.compile-reduce-overhead, fcache, fcache-cudagraphs or "
        "fcache@DIR, each optionally with :cold; the first is the baseline",
    )
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=30, help="steady steps per process")
    p.add_argument("--device", default="cpu")
    p.add_argument("--family", default="llama")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", help="write OUT.json and OUT.md")
    p.add_argument("--cold", action="store_true", help="compare cold starts (empty caches)")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds: start no round that would end past them, judged by the longest "
        "round so far (the first always runs)",
    )
    args, rest = p.parse_known_args()  # the rest goes to bench.measure (--dim, --dtype, ...)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="fcache-steady-ab-"))
    runs: dict[str, list[float]] = {_label(s): [] for s in args.system}
    cold: dict[str, float] = {}
    started, longest = time.monotonic(), 0.0
    try:
        for system in [] if args.cold else args.system:  # fill the caches (reported apart)
            if not _always_cold(system):
                cold[_label(system)] = _measure(system, args, rest, work, "cold")
        for r in range(args.rounds):
            if (
                r
                and args.budget is not None
                and (time.monotonic() - started + longest > args.budget)
            ):
                print(f"budget: {r} of {args.rounds} rounds fit in {args.budget:g} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                break
            round_start = time.monotonic()
            shift = r % len(args.system)
            for system in args.system[shift:] + args.system[:shift]:
                step = _measure(system, args, rest, work, f"round {r + 1}")
                runs[_label(system)].append(step)
            longest = max(longest, time.monotonic() - round_start)
            # After every round: a run cut short (a failed process, a killed command)
            # keeps the rounds it finished.
            result = _result(args, runs, cold, rounds=r + 1)
            _write(args, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=1))


def _result(
    args: argparse.Namespace, runs: dict[str, list[float]], cold: dict[str, float], rounds: int
) -> dict[str, Any]:
    """The report of `rounds` complete rounds: per system, the median over its processes,
    their spread and the ratio to the first system's."""
    base = statistics.median(runs[_label(args.system[0])])
    unit, scale = ("s", 1.0) if args.cold else ("ms", 1e3)
    summary = {
        s: {
            f"median_{unit}": round(statistics.median(v) * scale, 3),
            f"min_{unit}": round(min(v) * scale, 3),
            f"max_{unit}": round(max(v) * scale, 3),
            "ratio": round(statistics.median(v) / base, 3),
            f"processes_{unit}": [round(x * scale, 3) for x in v],
            **({"cold_process_ms": round(cold[s] * 1e3, 3)} if s in cold else {}),
        }
        for s, v in runs.items()
    }
    return {"command": " ".join(["python -m bench.steady_ab", *_shown(sys.argv[1:])]),
            "rounds": rounds, "summary": summary}  # fmt: skip


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.out:
        unit = "s" if args.cold else "ms"
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
        Path(f"{args.out}.md").write_text(_markdown(result, _label(args.system[0]), unit))


def _shown(argv: list[str]) -> list[str]:
    """The command line as the results show it: no path of the machine it ran on (another
    version's folder by its name, as `_label` names it; the output prefix under OUT/)."""
    shown = []
    for i, arg in enumerate(argv):
        if "@" in arg and not arg.startswith("-"):
            arg = _label(arg)
        elif i > 0 and argv[i - 1] == "--out":
            arg = f"OUT/{Path(arg).name}"
        shown.append(arg)
    return shown


def _always_cold(system: str) -> bool:
    """Whether every process of `system` starts with empty caches (`name:cold`)."""
    return system.endswith(":cold")


def _label(system: str) -> str:
    """`fcache@DIR` as `fcache@` and DIR's last component: no path of this machine."""
    name, _, code = system.partition("@")
    return f"{name}@{Path(code).name}" if code else name


def _measure(system: str, args: argparse.Namespace, rest: list[str], work: Path,
             label: str) -> float:  # fmt: skip
    """One fresh process's steady step, or with --cold its start; in seconds."""
    name, _, code = system.removesuffix(":cold").partition("@")
    empty = args.cold or _always_cold(system)
    if empty:  # caches of its own, empty
        fresh = Path(tempfile.mkdtemp(prefix="cold-", dir=work))
        env = launch.environment(launch.Caches(fresh / "fcache", fresh / "inductor"))
    else:
        env = dict(os.environ)
        env["FCACHE_DIR"] = str(work / "fcache")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-{name}")
    env.update(_SYSTEM_ENV.get(name, {}))  # fcache-cudagraphs: fcache's cache, graphs on
    name = _RUNNER_SYSTEM.get(name, name)
    env.pop("FCACHE_SERVER", None)
    cwd = ROOT
    if code:  # another version's fcache first on the path; bench from this checkout
        cwd = Path(code).resolve()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), str(ROOT),
                                                          env.get("PYTHONPATH")]))  # fmt: skip
    command = [sys.executable, "-m", "bench.measure", "--system", name, "--device",
               args.device, "--family", args.family, "--layers", str(args.layers),
               "--steps", str(args.steps), *rest]  # fmt: skip
    try:
        proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=args.timeout)  # fmt: skip
    finally:
        if empty:
            shutil.rmtree(fresh, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"{system} ({label}) failed:\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if args.cold:
        start = float(report["start_s"])
        print(f"{label:>8}  {system:<24} start {start:8.3f} s", file=sys.stderr, flush=True)
        return start
    step = float(report["steady_step_s"])
    print(f"{label:>8}  {system:<24} steady {step * 1e3:8.3f} ms", file=sys.stderr, flush=True)
    return step


def _markdown(result: dict[str, Any], base: str, unit: str) -> str:
    cold = unit == "s"  # --cold: starts, no priming process
    what = "median start (call + first step)" if cold else "median of process medians"
    lines = [f"`{result['command']}`", "", f"{result['rounds']} rounds.", "",
             f"| system | {what} | min | max | ratio to {base} "
             + ("|" if cold else "| the cold process (one) |"),
             "|---|---|---|---|---|" + ("" if cold else "---|")]  # fmt: skip
    for system, s in result["summary"].items():
        lines.append(f"| {system} | {s[f'median_{unit}']} {unit} | {s[f'min_{unit}']} | "
                     f"{s[f'max_{unit}']} | {s['ratio']}x |"
                     + ("" if cold else f" {s.get('cold_process_ms', '–')} ms |"))  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
