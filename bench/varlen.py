"""Variable-length training: the first step at each of many sequence lengths (issue #43).

    python -m bench.varlen --device cuda --family hf-llama --layers 4 --dim 1024 \\
        --lengths 2048,1024,2048,512,1536,768
    python -m bench.varlen --device cuda --family hf-llama --layers 4 --dim 1024 --lengths 20
    python -m bench.varlen --smoke          # CPU, a tiny model, three lengths (CI)

`--lengths` is a comma list, or one number N: N distinct lengths between --min-length and
--max-length (256 and 2048), the same every run (drawn with seed N).

Systems, each a fresh process (bench.launch's environment: fresh cache directories, no
FCACHE_* variable of the caller's): `torch.compile` cold (its default automatic dynamic),
`fcache-cold` (`fcache.jit`, empty caches), `fcache-warm` (a second process with fcache's
cache from the cold run and an empty Inductor cache). Per length: the first step's seconds
(call to gradients, synchronized), what was compiled during it (fcache's region compiles,
dynamic graphs compiled/loaded, Inductor's FX-graph cache misses/hits, stored functions
loaded), the steady step (median of --steps more steps) and the check against eager at
that length (the loss, |loss - eager| / |eager|, and the largest parameter-gradient
difference relative to the largest eager gradient). Prints a markdown table and writes
the JSON (and the table) to --out, with the steady step per length against
torch.compile's (median, range, lengths over issue #43's 1.05x).

`--rounds N` runs every system N times, round after round on new caches; the steady step
of a system at a length is then the median over its rounds. A 5-9 ms step is bound by the
host, whose speed moves between processes (and within one: torch.compile's step at one
length, measured twice in its process, differed by 1.24x on an H200,
bench/results/gpu-2026-11-29-4).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import compiles, launch

SYSTEMS = ("torch.compile", "fcache-cold", "fcache-warm")
# Relative tolerance of the check against eager, by dtype (bf16: a compiled kernel rounds
# otherwise than eager's; the tolerance only flags, every number is in the JSON).
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}


def lengths_of(text: str, low: int, high: int) -> list[int]:
    """A comma list of lengths, or N: N distinct lengths in [low, high], seeded by N."""
    if "," in text:
        return [int(x) for x in text.split(",")]
    n = int(text)
    if n > high - low + 1:
        raise ValueError(f"{n} distinct lengths do not fit in [{low}, {high}]")
    return random.Random(n).sample(range(low, high + 1), n)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.varlen", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--family", default="hf-llama")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--lengths", default=None, help="default 2048,1024,2048,512,1536,768")
    p.add_argument("--min-length", type=int, default=256)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3, help="steady steps per length (median)")
    p.add_argument("--rounds", type=int, default=1, help="processes per system, round by round")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--executors", default=None, help="fcache's executors (FCACHE_EXECUTORS)")
    p.add_argument("--out", type=Path, default=None, help="JSON path (and .md beside it)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per system")
    p.add_argument("--smoke", action="store_true", help="CPU, a tiny model, three lengths")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the measured system
    return p


def _smoke(args: argparse.Namespace) -> None:
    args.device, args.family, args.layers, args.dim, args.heads = "cpu", "hf-llama", 1, 32, 4
    args.vocab, args.batch, args.steps = 128, 2, 1
    args.lengths = args.lengths or "16,8,12"
    args.max_length = max(args.max_length, 16)
    args.executors = args.executors or "eager"  # static regions uncompiled: CI time


# -- the measured process ------------------------------------------------------------------


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from bench import hf

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    lengths = lengths_of(args.lengths, args.min_length, args.max_length)
    seq = max(lengths)

    def build() -> torch.nn.Module:
        model = hf.build(args.family, args.layers, args.dim, args.heads, args.vocab, seq)
        return model.to(device=device, dtype=dtype)

    model, reference = build(), build()
    reference.load_state_dict(model.state_dict())
    start = time.perf_counter()
    if args.child == "torch.compile":
        system: Any = torch.compile(model)
    else:
        import fcache

        names = tuple(args.executors.split(",")) if args.executors else None
        system = fcache.jit(model, executors=names)
    wrap = time.perf_counter() - start

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step(fn: Any, tokens: torch.Tensor) -> torch.Tensor:
        out = fn(tokens).logits
        loss = out.float().square().mean()
        loss.backward()
        return loss.detach()

    def compiled_so_far() -> dict[str, int]:
        return compiles.so_far(system if args.child != "torch.compile" else None)

    rows = []
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        tokens = torch.randint(0, hf.vocab_size(model), (args.batch, length), generator=gen)
        tokens = tokens.to(device)
        before = compiled_so_far()
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        loss = step(system, tokens)
        sync()
        first = time.perf_counter() - start
        after = compiled_so_far()
        # The check: eager at this length, the same weights, against this first step.
        reference.zero_grad(set_to_none=True)
        expected = step(reference, tokens)
        scale = max(float(q.grad.float().abs().max()) for q in reference.parameters())
        grad_error = max(
            float((p.grad.float() - q.grad.float()).abs().max()) if p.grad is not None else 1e30
            for p, q in zip(model.parameters(), reference.parameters(), strict=True)
            if q.grad is not None
        )
        times = []
        for _ in range(args.steps):
            model.zero_grad(set_to_none=True)
            sync()
            t = time.perf_counter()
            step(system, tokens)
            sync()
            times.append(time.perf_counter() - t)
        loss_error = abs(float(loss) - float(expected)) / max(abs(float(expected)), 1e-30)
        rows.append(
            {
                "length": length,
                "first_step_s": round(first, 4),
                "steady_step_s": round(statistics.median(times), 6) if times else None,
                "compiled": {k: after[k] - before.get(k, 0) for k in after},
                "loss": float(loss),
                "loss_eager": float(expected),
                "loss_rel_error": loss_error,
                "grad_rel_error": grad_error / max(scale, 1e-30),
                "ok": max(loss_error, grad_error / max(scale, 1e-30)) <= TOLERANCE[args.dtype],
            }
        )
        print(f"[{args.child}] length {length}: {first:.2f}s", file=sys.stderr, flush=True)
    return {
        "system": args.child,
        "wrap_s": round(wrap, 4),
        "total_first_steps_s": round(sum(r["first_step_s"] for r in rows), 4),
        "totals": compiled_so_far(),
        "rows": rows,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


# -- the parent: one fresh process per system -----------------------------------------------


def _argv(args: argparse.Namespace, system: str) -> list[str]:
    argv = ["-m", "bench.varlen", "--child", system]
    for name in ("device", "family", "layers", "dim", "heads", "vocab", "batch", "dtype"):
        argv += [f"--{name}", str(getattr(args, name))]
    argv += ["--lengths", args.lengths, "--min-length", str(args.min_length)]
    argv += ["--max-length", str(args.max_length), "--steps", str(args.steps)]
    if args.executors:
        argv += ["--executors", args.executors]
    return argv


def run_system(
    args: argparse.Namespace, system: str, caches: launch.Caches, logs: Path
) -> dict[str, Any]:
    import subprocess

    env = launch.environment(caches)
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{system}.stderr.txt").open("wb") as err:
        proc = subprocess.run(
            [sys.executable, *_argv(args, system)],
            cwd=launch.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=args.timeout,
        )
    if proc.returncode != 0:
        tail = (logs / f"{system}.stderr.txt").read_text(errors="replace")[-3000:]
        return {"system": system, "error": f"exit {proc.returncode}", "stderr_tail": tail}
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def table(results: list[dict[str, Any]], lengths: list[int]) -> str:
    ok = [r for r in results if "rows" in r]
    head = ["length"] + [f"{r['system']} first (s)" for r in ok]
    head += [f"{r['system']} steady (ms)" for r in ok] + ["compiled (per system)", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, length in enumerate(lengths):
        rows = [r["rows"][i] for r in ok]
        cells = [str(length)] + [f"{x['first_step_s']:.2f}" for x in rows]
        cells += [f"{1e3 * x['steady_step_s']:.2f}" if x["steady_step_s"] else "-" for x in rows]
        cells.append(
            "; ".join(
                f"{r['system']}: {_compiled(x['compiled'])}" for r, x in zip(ok, rows, strict=True)
            )
        )
        cells.append("ok" if all(x["ok"] for x in rows) else "MISMATCH")
        lines.append("| " + " | ".join(cells) + " |")
    total = ["total"] + [f"{r['total_first_steps_s']:.2f}" for r in ok] + [""] * len(ok)
    total += ["; ".join(f"{r['system']}: {_compiled(r['totals'])}" for r in ok), ""]
    lines.append("| " + " | ".join(total) + " |")
    for r in results:
        if "error" in r:
            lines.append(f"\n{r['system']} failed: {r['error']}")
    return "\n".join(lines)


def _compiled(c: dict[str, int]) -> str:
    parts = [f"{c.get('fx_graph_misses', 0)} Inductor graphs"]
    if "region_compiles" in c:
        parts = [
            f"{c['region_compiles']} regions",
            f"{c['dynamic_compiled']} dynamic (+{c['dynamic_loaded']} loaded)",
            f"{c['functions_loaded']} functions loaded",
        ]
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.smoke:
        _smoke(args)
    args.lengths = args.lengths or "2048,1024,2048,512,1536,768"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    if args.child:
        result = child(args)
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (json.dumps(result) + "\n").encode())
        return 0
    lengths = lengths_of(args.lengths, args.min_length, args.max_length)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}: {', '.join(SYSTEMS)}")
    out = args.out or Path(f"varlen-{args.device.split(':')[0]}-{len(lengths)}.json")
    results = []
    tables = []
    for round_ in range(1, args.rounds + 1):
        done = _round(args, systems, out, round_ if args.rounds > 1 else None)
        tables.append((f"Round {round_}\n\n" if args.rounds > 1 else "") + table(done, lengths))
        results += done
    text = "\n\n".join([*tables, steady_table(results, lengths)])
    print(text)
    doc = {
        "command": "python -m bench.varlen " + " ".join(argv if argv is not None else sys.argv[1:]),
        "lengths": lengths,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "complete": all("rows" in r for r in results),
        "all_ok": all(x["ok"] for r in results for x in r.get("rows", [])),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    return 0 if doc["complete"] else 1


def _round(
    args: argparse.Namespace, systems: list[str], out: Path, round_: int | None
) -> list[dict[str, Any]]:
    """Every system once, each a fresh process, on new caches (fcache's warm process on the
    cold one's)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="fcache-varlen-") as tmp:
        work = Path(tmp)
        fcache_dir = work / "fcache"
        for system in systems:
            caches = launch.Caches(
                fcache=work / "fcache-torch" if system == "torch.compile" else fcache_dir,
                inductor=work / f"inductor-{system}",  # each system's own, empty
            )
            logs = out.parent / f"{out.stem}-logs" / (f"round{round_}" if round_ else "")
            start = time.time()
            result = run_system(args, system, caches, logs)
            result["process_s"] = round(time.time() - start, 2)
            if round_ is not None:
                result["round"] = round_
            results.append(result)
            shown = result.get("total_first_steps_s", result.get("error"))
            print(f"{system}{f' (round {round_})' if round_ else ''}: {shown}", flush=True)
    return results


def steady_ratios(results: list[dict[str, Any]], lengths: list[int]) -> dict[str, list[float]]:
    """Per system other than torch.compile: at each length, its steady step over
    torch.compile's, each the median over the rounds (issue #43's bar: at most 1.05)."""

    def steady(system: str) -> list[float] | None:
        runs = [r["rows"] for r in results if r["system"] == system and "rows" in r]
        if not runs or any(
            row[i]["steady_step_s"] is None for row in runs for i in range(len(lengths))
        ):
            return None
        return [
            statistics.median(row[i]["steady_step_s"] for row in runs) for i in range(len(lengths))
        ]

    base = steady("torch.compile")
    ratios = {}
    for system in dict.fromkeys(r["system"] for r in results):
        if system != "torch.compile" and base and (own := steady(system)):
            ratios[system] = [a / b for a, b in zip(own, base, strict=True)]
    return ratios


def steady_table(results: list[dict[str, Any]], lengths: list[int]) -> str:
    """The steady step per length against torch.compile's, summed up."""
    ratios = steady_ratios(results, lengths)
    if not ratios:
        return ""
    head = ["system", "median ratio", "range", "lengths over 1.05x", "per length"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for system, values in ratios.items():
        cells = [system, f"{statistics.median(values):.2f}x",
                 f"{min(values):.2f}-{max(values):.2f}x",
                 f"{sum(v > 1.05 for v in values)} of {len(values)}",
                 " ".join(f"{v:.2f}" for v in values)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "Steady step against torch.compile's, per length\n\n" + "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
