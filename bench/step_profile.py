"""Where a steady training step's time goes: wall time per step against GPU kernel time
per step (torch.profiler), kernel launches per step and the top kernels, for one system in
this process (run each system in a fresh process, on the same GPU, in one call).

    python -m bench.step_profile tc 2        # torch.compile, Hugging Face Llama, 2 layers
    python -m bench.step_profile tc-ro 2     # torch.compile(mode="reduce-overhead")
    python -m bench.step_profile fcache 2    # fcache; FCACHE_* variables pick its settings
    python -m bench.step_profile eager 2     # no compiler: what any first step costs
    python -m bench.step_profile fcache 2 first.txt   # and where the first step's host time goes

A step whose wall time is well above its GPU time is bound by the host. Prints one JSON line,
with `wrap_s` (the torch.compile / fcache.jit call itself) apart from `first_s`.
With a third argument, the wrapping call and the first step run under cProfile and the
functions that took the most time (cumulative, then own) are written to that file.
FCACHE_PROFILE_FAMILY=hf-gpt2 profiles GPT-2 instead of Llama; FCACHE_PROFILE_KERNELS=FILE
writes every kernel's GPU time and launches per step to FILE (JSON), to compare systems.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench import hf


def main() -> None:
    system, layers = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    family = os.environ.get("FCACHE_PROFILE_FAMILY", "hf-llama")
    model = hf.build(family, layers, 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
    tokens = torch.randint(0, hf.vocab_size(model), (2, 2048), device="cuda")
    profiler = cProfile.Profile() if len(sys.argv) > 3 else None
    if profiler is not None:
        profiler.enable()
    start = time.perf_counter()
    if system == "eager":
        fn: Any = model
    elif system == "tc":
        fn = torch.compile(model)
    elif system == "tc-ro":
        fn = torch.compile(model, mode="reduce-overhead")
    else:
        import fcache

        fn = fcache.jit(model)

    graphs = system == "tc-ro" or os.environ.get("FCACHE_CUDA_GRAPHS") == "1"

    def step() -> None:
        if graphs:  # outputs of a CUDA-graph replay live until the next one: a new step
            # says so (only then: the call imports Inductor's compile_fx, a second or more)
            torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)  # as optimizer.zero_grad() does in a training loop
        out = fn(tokens)
        logits = out.logits if hasattr(out, "logits") else out[0]
        logits.float().pow(2).mean().backward()

    wrap = time.perf_counter() - start
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
        with open(sys.argv[3], "w") as f:
            stats = pstats.Stats(profiler, stream=f)
            stats.sort_stats("cumulative").print_stats(80)
            stats.sort_stats("tottime").print_stats(40)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    if path := os.environ.get("FCACHE_PROFILE_KERNELS"):
        with open(path, "w") as f:  # every kernel: GPU microseconds per step, launches per step
            counts: dict[str, int] = {}
            for e in kernels:
                counts[e.name] = counts.get(e.name, 0) + 1
            table = {n: [round(us, 1), counts[n] / 3] for n, us in by_name.items()}
            json.dump(dict(sorted(table.items(), key=lambda kv: -kv[1][0])), f, indent=0)
    print(json.dumps({
        "system": system,
        "route": os.environ.get("FCACHE_INDUCTOR_CUDA", "python"),
        "layers": layers,
        "family": family,
        "wrap_s": round(wrap, 3),
        "first_s": round(first, 2),
        "steady_ms": round(times[len(times) // 2] * 1e3, 2),
        "gpu_ms_per_step": round(sum(by_name.values()) / 1e3, 2),
        "kernels_per_step": len(kernels) / 3,
        "top": [(name[:70], round(us / 1e3, 3)) for name, us in top],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
