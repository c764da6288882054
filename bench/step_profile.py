"""Where a steady training step's time goes: wall time per step against GPU kernel time
per step (torch.profiler), kernel launches per step and the top kernels, for one system in
this process (run each system in a fresh process, on the same GPU, in one call).

    python -m bench.step_profile tc 2        # torch.compile, Hugging Face Llama, 2 layers
    python -m bench.step_profile tc-ro 2     # torch.compile(mode="reduce-overhead")
    python -m bench.step_profile fcache 2    # fcache; FCACHE_* variables pick its settings
    python -m bench.step_profile eager 2     # no compiler: what any first step costs
    python -m bench.step_profile blocks 2    # fcache.jit(model, blocks=True)
    python -m bench.step_profile regional 2  # torch's regional recipe: layer.compile() each
    python -m bench.step_profile fcache 2 first.txt   # and where the first step's host time goes

A step whose wall time is well above its GPU time is bound by the host. Prints one JSON line,
with `wrap_s` (the torch.compile / fcache.jit call itself) apart from `first_s`.
With a third argument, the wrapping call and the first step run under cProfile and the
functions that took the most time (cumulative, then own) are written to that file.
FCACHE_PROFILE_FAMILY=hf-gpt2 profiles GPT-2 instead of Llama (any bench/hf.py family),
FCACHE_PROFILE_SIZE=dim,heads,vocab,batch,seq another size (1024,16,32000,2,2048).
FCACHE_PROFILE_KERNELS=FILE writes every kernel's GPU time and launches per step to FILE
(JSON), to compare systems.
FCACHE_PROFILE_STEPS=N times N steady steps (15); FCACHE_PROFILE_GC=freeze or off moves
what the first step made out of Python's collector, or stops it, before them, and
FCACHE_PROFILE_IMPORT=a,b imports those modules first (experiments).
FCACHE_PROFILE_REGIONS=FILE writes the host time spent inside Inductor's generated wrappers
(bench.region_calls; its timing adds well under a microsecond per wrapper call), and
FCACHE_PROFILE_AUTOGRAD_THREADS=0 runs the backward on the calling thread.
FCACHE_PROFILE_STEADY=FILE writes a cProfile of 10 steady steps (with
FCACHE_PROFILE_AUTOGRAD_THREADS=0 the backward's Python shows too).
FCACHE_PROFILE_PHASES=FILE times the forward and the backward apart (the GPU drained before
each: host time until the call returns, then until its kernels are done) and writes that,
with where the forward's host time goes (cProfile of its calls alone), to FILE.

Besides wall and GPU time per step it prints `host_ms` (the step's time until its last
call returns, before waiting for the GPU: what the host needs to launch one step), the
collector's passes and time during the timed steps, the host-side events per step that
torch's profiler counts (dispatcher ops and CUDA API calls, by name), and live threads.
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import json
import os
import pstats
import sys
import threading
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench import hf, region_calls


def main() -> None:
    system, layers = sys.argv[1], int(sys.argv[2])
    for name in filter(None, os.environ.get("FCACHE_PROFILE_IMPORT", "").split(",")):
        importlib.import_module(name)  # does a module's presence alone slow the step?
    micro: dict[str, Any] = {}
    torch.manual_seed(0)
    family = os.environ.get("FCACHE_PROFILE_FAMILY", "hf-llama")
    size = os.environ.get("FCACHE_PROFILE_SIZE", "1024,16,32000,2,2048")
    dim, heads, vocab, batch, seq = (int(x) for x in size.split(","))
    model = hf.build(family, layers, dim, heads, vocab, seq).to("cuda", torch.bfloat16)
    found = hf.inputs(family, model, batch, seq, torch.Generator().manual_seed(1))
    inputs = {
        k: v.to("cuda", torch.bfloat16 if v.is_floating_point() else v.dtype)
        for k, v in found.items()
    }
    _micro(micro, "start")
    regions = os.environ.get("FCACHE_PROFILE_REGIONS")
    if regions:
        region_calls.install()
        if system == "fcache":
            region_calls.install_graphs()
    if os.environ.get("FCACHE_PROFILE_AUTOGRAD_THREADS") == "0":  # backward on this thread
        torch.autograd.set_multithreading_enabled(False)  # set on construction, for good
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
    elif system == "regional":
        from fcache.engine.blocks import repeated_blocks

        for layer in repeated_blocks(model):  # the layers blocks=True would compile
            layer.compile()
        fn = model
    else:
        import fcache

        fn = fcache.jit(model, blocks=system == "blocks")

    graphs = system == "tc-ro" or os.environ.get("FCACHE_CUDA_GRAPHS") == "1"

    def step() -> None:
        if graphs:  # outputs of a CUDA-graph replay live until the next one: a new step
            # says so (only then: the call imports Inductor's compile_fx, a second or more)
            torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)  # as optimizer.zero_grad() does in a training loop
        out = fn(**inputs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        logits.float().pow(2).mean().backward()

    wrap = time.perf_counter() - start
    _micro(micro, "wrapped")
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    _micro(micro, "first")
    if profiler is not None:
        profiler.disable()
        with open(sys.argv[3], "w") as f:
            stats = pstats.Stats(profiler, stream=f)
            stats.sort_stats("cumulative").print_stats(80)
            stats.sort_stats("tottime").print_stats(40)
    if (gc_mode := os.environ.get("FCACHE_PROFILE_GC", "")) == "freeze":
        gc.collect()
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    collector = _Collector()
    gc.callbacks.append(collector)
    memory = torch.cuda.memory_stats()
    times, host = [], []
    region_calls.reset()
    print("step_profile: timing steady steps", file=sys.stderr, flush=True)  # for samplers
    for _ in range(int(os.environ.get("FCACHE_PROFILE_STEPS", "15"))):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    gc.callbacks.remove(collector)
    if regions:
        found = region_calls.report(len(times))
        region_calls.record()
        step()
        torch.cuda.synchronize()
        found["replay"] = region_calls.replay()
        with open(regions, "w") as f:
            json.dump(found, f, indent=1)
    if phases := os.environ.get("FCACHE_PROFILE_PHASES"):
        _phases(model, fn, inputs, phases)
    if steady := os.environ.get("FCACHE_PROFILE_STEADY"):  # where steady steps' host time goes
        steady_profiler = cProfile.Profile()
        steady_profiler.enable()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        steady_profiler.disable()
        with open(steady, "w") as f:
            stats = pstats.Stats(steady_profiler, stream=f)
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(60)
    _micro(micro, "steady")
    memory_after = torch.cuda.memory_stats()
    allocator = {  # the caching allocator's trips to the driver during the timed steps
        k: memory_after.get(k, 0) - memory.get(k, 0)
        for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")
    }
    times.sort()
    host.sort()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    if trace := os.environ.get("FCACHE_PROFILE_TRACE"):
        prof.export_chrome_trace(trace)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    host_events: dict[str, int] = {}
    host_us: dict[str, float] = {}  # own host time per event name, per step
    for e in prof.events():
        if e.device_type.name == "CPU":
            host_events[e.name] = host_events.get(e.name, 0) + 1
            host_us[e.name] = host_us.get(e.name, 0.0) + e.self_cpu_time_total / 3
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
        "steady_range_ms": [round(times[0] * 1e3, 2), round(times[-1] * 1e3, 2)],
        "host_ms": round(host[len(host) // 2] * 1e3, 2),
        "gc": {"mode": gc_mode or "on", "steps": len(times), **collector.summary()},
        "gpu_ms_per_step": round(sum(by_name.values()) / 1e3, 2),
        "kernels_per_step": len(kernels) / 3,
        "top": [(name[:70], round(us / 1e3, 3)) for name, us in top],
        "host_events_per_step": sum(host_events.values()) / 3,
        "host_top": [(n[:60], c / 3) for n, c in _most(host_events, 25)],
        "host_top_us": [(n[:60], round(us)) for n, us in _most(host_us, 25)],
        "allocator": allocator,
        "micro_us": micro,
        "threads": sorted(t.name for t in threading.enumerate()),
    }))  # fmt: skip


def _phases(model: Any, fn: Any, inputs: dict[str, torch.Tensor], path: str) -> None:
    """Forward and backward of a step timed apart, each started on a drained GPU: `host`
    until the call returns, `wall` until its kernels are done (median ms of 15); then the
    forward's calls under cProfile, own and cumulative time per function."""
    spans: dict[str, list[float]] = {"fwd_host": [], "fwd_wall": [], "bwd_host": [], "bwd_wall": []}

    def forward() -> Any:
        out = fn(**inputs)
        return out.logits if hasattr(out, "logits") else out[0]

    for _ in range(15):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = forward()
        spans["fwd_host"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
        spans["fwd_wall"].append(time.perf_counter() - start)
        loss = logits.float().pow(2).mean()
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss.backward()
        spans["bwd_host"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
        spans["bwd_wall"].append(time.perf_counter() - start)
        del logits, loss
    profiler = cProfile.Profile()
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        profiler.enable()
        logits = forward()
        profiler.disable()
        logits.float().pow(2).mean().backward()
        del logits
    torch.cuda.synchronize()
    with open(path, "w") as f:
        medians = {k: round(sorted(v)[len(v) // 2] * 1e3, 2) for k, v in spans.items()}
        f.write(json.dumps(medians) + "\n")
        stats = pstats.Stats(profiler, stream=f)
        stats.sort_stats("tottime").print_stats(45)
        stats.sort_stats("cumulative").print_stats(45)


def _micro(into: dict[str, Any], when: str) -> None:
    """With FCACHE_PROFILE_MICRO=1: the host cost of a few calls in this process now (us,
    best of 5): a Python loop step, a CUDA add_, a CUDA empty. Is the process slow, or the
    code it runs?"""
    if os.environ.get("FCACHE_PROFILE_MICRO") != "1":
        return
    t = torch.empty(256, device="cuda")

    def best(fn: Any, n: int = 2000) -> float:
        runs = []
        for _ in range(5):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(n)
            runs.append((time.perf_counter() - start) / n * 1e6)
        return round(min(runs), 3)

    def loop(n: int) -> None:
        x = 0
        for i in range(n):
            x += i

    def add(n: int) -> None:
        for _ in range(n):
            t.add_(1)

    def empty(n: int) -> None:
        for _ in range(n):
            torch.empty(256, device="cuda")

    into[when] = {"py": best(loop, 20000), "add": best(add), "empty": best(empty)}


def _most(counts: dict[str, Any], n: int) -> list[tuple[str, Any]]:
    return sorted(counts.items(), key=lambda kv: -kv[1])[:n]


class _Collector:
    """Python's collector passes (per generation) and their time, from gc.callbacks."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.passes[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start

    def summary(self) -> dict[str, Any]:
        return {"passes": self.passes, "ms": round(self.seconds * 1e3, 2)}


if __name__ == "__main__":
    main()
