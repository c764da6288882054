"""Generation: tokens per second, time to first token and compiles of `model.generate` (issue #43).

    python -m bench.generate --device cuda --family hf-llama --layers 4 --dim 1024 \\
        --batch 1,8 --prompt 128 --new-tokens 256
    python -m bench.generate --smoke        # CPU, a tiny model, two new tokens (CI)

A Hugging Face causal LM with random weights (bench/hf.py's configs, its key/value cache on),
greedy decoding of exactly --new-tokens tokens (no end-of-sequence token) after a
--prompt-token prompt, per batch size. Systems, each a fresh process per batch size
(bench.launch's environment: fresh cache directories, no FCACHE_* variable of the caller's):

- `eager`: `model.generate(...)` with a DynamicCache (`--cache static`: a static one);
- `torch.compile`: `model.forward = torch.compile(model.forward)` (Hugging Face's recipe;
  `torch.compile(model).generate` runs uncompiled), default mode, automatic dynamic, the
  same cache as eager;
- `torch.compile-ro`: Transformers' own compile of the decode step with a static cache
  (`cache_implementation="static"`, `disable_compile=False`: `generate` compiles each
  decode step's call with the model's default CompileConfig, `mode="reduce-overhead"`,
  `fullgraph=True`, CUDA graphs; the prefill runs eager; CUDA only). Wrapping
  `model.forward` in `torch.compile(..., mode="reduce-overhead")` instead fails inside
  `generate` (a CUDA graph's output overwritten by the next replay while Inductor's
  autotuner clones it: bench/results/gpu-matrix-2026-11-28-3);
- `fcache-cold`: `fcache.jit(model).generate(...)`, empty caches, the same cache as eager;
- `fcache-warm`: the same, a second process with fcache's cache from the cold run (and an
  empty Inductor cache);
- `fcache-cg-cold`, `fcache-cg-warm`: `FCACHE_CUDA_GRAPHS=1` with a static cache, against
  torch.compile-ro (CUDA only).

Transformers' own compile of the decode step (on a GPU with a static cache) is off in every
other system (`disable_compile=True`), so each system compiles what it says.

Per process: the first `generate` call, timed from before the system's compile call (the
`torch.compile` / `fcache.jit` call and every compile are in it): time to first token
(`first_token_s`: to the first call of a logits processor, synchronized) and to the end;
then --repeats more calls: tokens per second (batch x new tokens / the median call) and
decode tokens per second (after the first token); Dynamo graphs, Inductor's FX-graph
compiles and fcache's compiles in the first call and in the repeats (none is the bar: no
per-token compile after warm-up); the tokens against eager's (same weights, computed in
the parent's eager run: `match` is the share of new tokens before the first difference,
which bf16 rounding can end early on random weights). Prints a markdown table with ratios
against torch.compile measured in the same invocation and writes the JSON (and the table)
to --out.

`--rounds N` runs every system N times, round after round (each round on new, empty
caches), and adds a summary: per system, the median of all its calls after the first, in
all rounds, and the ratio of those medians. A host-bound decode's speed moves between
processes of one system by more than the differences between systems (an H200, batch 8:
reduce-overhead's processes 4383 and 6021 tokens per second in one invocation,
bench/results/gpu-2026-11-29-4), so one process per system does not settle a ratio.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import compiles, launch

SYSTEMS = (
    "eager",
    "torch.compile",
    "torch.compile-ro",
    "fcache-cold",
    "fcache-warm",
    "fcache-cg-cold",
    "fcache-cg-warm",
)
CUDA_ONLY = ("torch.compile-ro", "fcache-cg-cold", "fcache-cg-warm")
STATIC = CUDA_ONLY  # systems that always run with a static key/value cache
# The system each one's ratios are taken against.
BASELINE = {
    "fcache-cold": "torch.compile",
    "fcache-warm": "torch.compile",
    "fcache-cg-cold": "torch.compile-ro",
    "fcache-cg-warm": "torch.compile-ro",
    "torch.compile-ro": "torch.compile",
    "eager": "torch.compile",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--family", default="hf-llama")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                   help="key/value cache of eager, torch.compile and fcache-cold/warm")  # fmt: skip
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--repeats", type=int, default=3, help="generate calls after the first")
    p.add_argument("--rounds", type=int, default=1, help="processes per system, round by round")
    p.add_argument("--systems", default=None, help="default: all (the CUDA-only ones on CUDA)")
    p.add_argument("--executors", default=None, help="fcache's executors (FCACHE_EXECUTORS)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each process")
    p.add_argument("--out", type=Path, default=None, help="JSON path (and .md beside it)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    p.add_argument("--smoke", action="store_true", help="CPU, a tiny model, two new tokens")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # the measured system
    return p


def _smoke(args: argparse.Namespace) -> None:
    args.device, args.family, args.layers, args.dim, args.heads = "cpu", "hf-llama", 1, 32, 4
    args.vocab, args.batch, args.prompt, args.new_tokens, args.repeats = 128, "1", 8, 2, 1
    args.executors = args.executors or "eager"  # static regions uncompiled: CI time
    args.threads = args.threads or 1


def cache_argument(model: Any) -> str:
    """The name of a Hugging Face model's key/value cache argument: `cache` from
    transformers 5.2x, `past_key_values` before."""
    names = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in names else "past_key_values"


# -- the measured process ------------------------------------------------------------------


def build(args: argparse.Namespace, batch: int) -> tuple[Any, Any]:
    """The model (eval mode, its cache on, no end-of-sequence token) and the prompt."""
    import torch

    from bench import hf

    seq = args.prompt + args.new_tokens
    model = hf.build(args.family, args.layers, args.dim, args.heads, args.vocab, seq).eval()
    model.config.use_cache = True
    config = model.generation_config
    config.eos_token_id, config.pad_token_id, config.do_sample = None, 0, False
    model = model.to(device=torch.device(args.device), dtype=getattr(torch, args.dtype))
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, hf.vocab_size(model), (batch, args.prompt), generator=gen)
    return model, ids.to(args.device)


def child(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    import torch
    import transformers

    device = torch.device(args.device)
    model, ids = build(args, batch)
    system = args.child
    static = system in STATIC or args.cache == "static"

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    class FirstToken(transformers.LogitsProcessor):  # type: ignore[misc]
        """Called with the first token's logits: the time to first token."""

        def __init__(self) -> None:
            self.at: float | None = None

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if self.at is None:
                sync()
                self.at = time.perf_counter()
            return scores

    options: dict[str, Any] = dict(
        max_new_tokens=args.new_tokens, do_sample=False,
        use_cache=True, disable_compile=True, attention_mask=torch.ones_like(ids),
    )  # fmt: skip
    if static:
        options["cache_implementation"] = "static"

    sync()
    start = time.perf_counter()
    if system == "torch.compile":
        model.forward = torch.compile(model.forward)
        generate: Any = model.generate
        measured: Any = None
    elif system == "torch.compile-ro":
        options["disable_compile"] = False  # generate compiles the decode step itself
        generate, measured = model.generate, None
    elif system.startswith("fcache"):
        import fcache

        names = tuple(args.executors.split(",")) if args.executors else None
        measured = fcache.jit(model, executors=names)
        generate = measured.generate
    else:
        generate, measured = model.generate, None
    wrap = time.perf_counter() - start

    def compiled_so_far() -> dict[str, int]:
        return compiles.so_far(measured)

    def call() -> tuple[Any, float, float]:
        first = FirstToken()
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = generate(
                ids, logits_processor=transformers.LogitsProcessorList([first]), **options
            )
        sync()
        end = time.perf_counter()
        return out, (first.at or end) - t, end - t

    out, first_token, first_call = call()
    after_first = compiled_so_far()
    tokens = out[:, ids.shape[1] :]
    assert tokens.shape == (batch, args.new_tokens), tokens.shape
    calls, decodes = [], []
    for _ in range(args.repeats):
        _, to_first, total = call()
        calls.append(total)
        decodes.append(total - to_first)
    after = compiled_so_far()
    median = statistics.median(calls) if calls else first_call
    decode = statistics.median(decodes) if decodes else first_call - first_token
    return {
        "system": system,
        "batch": batch,
        "cache": "static" if static else "dynamic",
        "wrap_s": round(wrap, 4),
        "first_token_s": round(wrap + first_token, 4),
        "first_call_s": round(wrap + first_call, 4),
        "call_s": round(median, 5),
        "calls_s": [round(c, 5) for c in calls],
        "tokens_per_s": round(batch * args.new_tokens / median, 2),
        "decode_tokens_per_s": round(batch * (args.new_tokens - 1) / max(decode, 1e-9), 2),
        "compiled_first_call": after_first,
        "compiled_after_first": {k: after[k] - after_first[k] for k in after},
        "tokens": tokens.tolist(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


# -- the parent: one fresh process per system and batch size --------------------------------


def _argv(args: argparse.Namespace, system: str, batch: int) -> list[str]:
    argv = ["-m", "bench.generate", "--child", system, "--batch", str(batch)]
    for name in ("device", "family", "layers", "dim", "heads", "vocab", "prompt", "dtype"):
        argv += [f"--{name}", str(getattr(args, name))]
    argv += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
    argv += ["--cache", args.cache]
    if args.executors:
        argv += ["--executors", args.executors]
    return argv


def run_system(
    args: argparse.Namespace, system: str, batch: int, caches: launch.Caches, logs: Path
) -> dict[str, Any]:
    import subprocess

    env = launch.environment(caches, threads=args.threads)
    if system.startswith("fcache-cg"):
        env["FCACHE_CUDA_GRAPHS"] = "1"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{system}-b{batch}.stderr.txt"
    with log.open("wb") as err:
        try:
            proc = subprocess.run(
                [sys.executable, *_argv(args, system, batch)],
                cwd=launch.ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                timeout=args.timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"system": system, "batch": batch, "error": f"timeout after {args.timeout} s"}
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        return {"system": system, "batch": batch, "error": f"exit {proc.returncode}",
                "stderr_tail": tail}  # fmt: skip
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """The share of new tokens before the first one that differs, over the batch."""
    same = 0
    for row, ref in zip(tokens, reference, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(row, ref, strict=True)) if a != b), len(ref))
        same += n
    return same / max(1, sum(len(r) for r in reference))


def _compiled(c: dict[str, int]) -> str:
    if "region_compiles" in c:
        return (
            f"{c['graphs']} graphs: {c['region_compiles']} regions, "
            f"{c['dynamic_compiled']} dynamic (+{c['dynamic_loaded']} loaded), "
            f"{c['programs_loaded']} programs loaded"
        )
    return f"{c['dynamo_graphs']} graphs: {c['fx_graph_misses']} Inductor compiles"


def _later(c: dict[str, int]) -> int:
    """Compiles after the first call: graphs traced, Inductor's and fcache's compiles."""
    keys = ("dynamo_graphs", "fx_graph_misses", "region_compiles", "dynamic_compiled")
    return sum(c.get(k, 0) for k in keys)


def table(results: list[dict[str, Any]]) -> str:
    head = [
        "batch", "system", "tokens/s", "decode tokens/s", "first token (s)",
        "first call (s)", "compiled in the first call", "compiled after",
        "tokens/s vs baseline", "first token vs baseline", "same tokens as eager",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ok = {(r["batch"], r["system"], r.get("round")): r for r in results if "tokens_per_s" in r}
    rounds = len({r.get("round") for r in results}) > 1
    for r in results:
        if "tokens_per_s" not in r:
            continue
        base = ok.get((r["batch"], BASELINE.get(r["system"], ""), r.get("round")))
        ratio = first = "-"
        if base is not None:
            ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x {base['system']}"
            first = f"{r['first_token_s'] / base['first_token_s']:.2f}x"
        eager = ok.get((r["batch"], "eager", r.get("round")))
        match = f"{agreement(r['tokens'], eager['tokens']):.0%}" if eager else "-"
        system = f"{r['system']} (round {r['round']})" if rounds else r["system"]
        cells = [
            str(r["batch"]), system, f"{r['tokens_per_s']:.1f}",
            f"{r['decode_tokens_per_s']:.1f}", f"{r['first_token_s']:.2f}",
            f"{r['first_call_s']:.2f}", _compiled(r["compiled_first_call"]),
            str(_later(r["compiled_after_first"])), ratio, first, match,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    for r in results:
        if "error" in r:
            lines.append(f"\n{r['system']} (batch {r['batch']}) failed: {r['error']}")
    if rounds:
        lines += ["", pooled_table(results)]
    return "\n".join(lines)


def pooled(results: list[dict[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """Per (batch, system): its calls after the first from every round, their median and
    the tokens per second it makes, and the rounds that ran."""
    calls: dict[tuple[int, str], list[float]] = {}
    tokens: dict[tuple[int, str], int] = {}
    for r in results:
        if r.get("calls_s"):
            key = (r["batch"], r["system"])
            calls.setdefault(key, []).extend(r["calls_s"])
            tokens[key] = r["batch"] * len(r["tokens"][0])
    return {
        key: {
            "calls": len(c),
            "rounds": sum(1 for r in results if (r["batch"], r["system"]) == key),
            "median_call_s": statistics.median(c),
            "tokens_per_s": tokens[key] / statistics.median(c),
        }
        for key, c in calls.items()
    }


def pooled_table(results: list[dict[str, Any]]) -> str:
    """The summary of several rounds: pooled medians and their ratios."""
    summary = pooled(results)
    head = ["batch", "system", "rounds", "calls", "median call (s)", "tokens/s", "vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (batch, system), row in summary.items():
        base = summary.get((batch, BASELINE.get(system, "")))
        ratio = "-"
        if base is not None:
            ratio = f"{row['tokens_per_s'] / base['tokens_per_s']:.2f}x {BASELINE[system]}"
        cells = [str(batch), system, str(row["rounds"]), str(row["calls"]),
                 f"{row['median_call_s']:.4f}", f"{row['tokens_per_s']:.1f}", ratio]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.smoke:
        _smoke(args)
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    batches = [int(b) for b in str(args.batch).split(",")]
    if args.child:
        result = child(args, batches[0])
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (json.dumps(result) + "\n").encode())
        return 0
    cuda = args.device.startswith("cuda")
    default = [s for s in SYSTEMS if cuda or s not in CUDA_ONLY]
    systems = [s for s in args.systems.split(",") if s] if args.systems else default
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}: {', '.join(SYSTEMS)}")
    if not cuda and set(systems) & set(CUDA_ONLY):
        raise SystemExit(f"{', '.join(CUDA_ONLY)} need CUDA (--device cuda)")
    out = args.out or Path(f"generate-{args.device.split(':')[0]}-l{args.layers}.json")
    out = out if out.suffix == ".json" else out.with_name(out.name + ".json")
    results = []
    for round_ in range(1, args.rounds + 1):
        results += _round(args, batches, systems, out, round_ if args.rounds > 1 else None)
    text = table(results)
    print(text)
    doc = {
        "command": "python -m bench.generate "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": os.environ.get("FCACHE_BENCH_COMMIT", "unknown"),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "complete": all("tokens_per_s" in r for r in results),
    }
    if args.rounds > 1:
        doc["pooled"] = [
            {"batch": b, "system": s, **row} for (b, s), row in pooled(results).items()
        ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(text + "\n")
    return 0 if doc["complete"] else 1


def _round(
    args: argparse.Namespace,
    batches: list[int],
    systems: list[str],
    out: Path,
    round_: int | None,
) -> list[dict[str, Any]]:
    """Every system at every batch size once, each a fresh process, on new caches."""
    results = []
    with tempfile.TemporaryDirectory(prefix="fcache-generate-") as tmp:
        work = Path(tmp)
        for batch in batches:
            for system in systems:
                # fcache's cold and warm processes share one FCACHE_DIR per batch size (and
                # the CUDA driver's cache, the machine's); every process its own, empty
                # Inductor directory.
                group = "cg" if system.startswith("fcache-cg") else "plain"
                fcache_dir = work / f"fcache-{group}-b{batch}"
                is_fcache = system.startswith("fcache")
                caches = launch.Caches(
                    fcache=fcache_dir if is_fcache else work / f"fcache-{system}-b{batch}",
                    inductor=work / f"inductor-{system}-b{batch}",
                    cuda=work / f"cuda-{group}-b{batch}" if is_fcache else None,
                )
                start = time.time()
                logs = out.parent / f"{out.stem}-logs" / (f"round{round_}" if round_ else "")
                result = run_system(args, system, batch, caches, logs)
                result["process_s"] = round(time.time() - start, 2)
                if round_ is not None:
                    result["round"] = round_
                results.append(result)
                shown = result.get("tokens_per_s", result.get("error"))
                where = f" (round {round_})" if round_ else ""
                print(f"batch {batch} {system}{where}: {shown} tokens/s", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
