"""One measurement: an example model under one system, first step and steady steps, as JSON.

    python -m fcache.examples.run --system fcache --layers 2 --dim 64

Meant to run in a fresh process (that is what "first step" means), launched by
`fcache demo` and by bench/. The last line of stdout is one JSON object:
first_step_s, steady_step_s (median), compiles, unique_regions, regions, peak_memory_bytes
(CUDA), peak_rss_bytes, max_abs_error (outputs against eager, when --check), the split of the
first step below, first_step_done_unix (wall clock when the first step ended, for runs of
several processes at once), plus the configuration.

Systems: eager; torch.compile (Inductor, whole model); torch.compile-regional (each block
compiled separately, PyTorch's regional-compilation recipe); fcache; thunder (`thunder.jit`
with its default executors, nvFuser among them on CUDA; Thunder 0.2.6 imports nvFuser under
its legacy module name, so `nvfuser_direct` is aliased to `nvfuser` first).

The first step is split where the system exposes it (see `_split`):
- compile_load_s: wall time spent compiling or loading graphs. fcache: its own
  `graph_seconds` (`fcache.stats`: partition, keys, cache look-ups, compiles, loads).
  torch.compile: Inductor's own `compile_fx_inner` timer (one entry per
  forward/backward graph) plus its `AOTAutogradCache.inductor_load` timer (a warm
  AOTAutograd cache loads graphs without compile_fx_inner). thunder: the first step minus
  tracing minus a steady step (transforms and nvFuser's compiles happen inside the first
  execution).
- run_s: the median steady step, standing in for the first step's own computation.
- capture_s: what is left, first_step_s - compile_load_s - run_s: Dynamo, AOTAutograd
  tracing and the rest of the framework's work, including compile work a system defers to
  the first execution (autotuning, lazily built kernels). thunder: its interpreter's
  tracing time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from fcache.examples.models import ModelConfig, build, sample_tokens

SYSTEMS = ("eager", "torch.compile", "torch.compile-regional", "fcache", "thunder")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Tensor methods that torch 2.13 removed (named tensors) and Thunder 0.2.6 still names.
_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")
# Inductor's timers (torch._dynamo.utils.compilation_time_metrics) of compiling a graph and of
# loading one from a warm AOTAutograd cache, which skips compile_fx_inner.
_INDUCTOR_TIMERS = ("compile_fx_inner", "AOTAutogradCache.inductor_load")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--family", choices=("llama", "gpt"), default="llama")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", choices=("train", "infer"), default="train")
    p.add_argument("--steps", type=int, default=5, help="steady steps to time after the first")
    p.add_argument("--executors", default=None, help="fcache executors, e.g. inductor,eager")
    p.add_argument("--check", action="store_true", help="compare outputs with eager")
    return p


def _import_thunder() -> Any:
    """`thunder`, importable on the torch versions the benchmark meets (see module doc)."""
    try:
        import nvfuser_direct

        sys.modules.setdefault("nvfuser", nvfuser_direct)
    except ImportError:
        pass  # Thunder then runs without nvFuser (CPU), which the report records
    for name in _NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _named_tensor_stub(name))
    import thunder

    return thunder


def _named_tensor_stub(name: str) -> Callable[..., Any]:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"Tensor.{name} was removed from torch")

    stub.__name__ = name  # Thunder checks that a registered method's name matches
    return stub


def _prepare(system: str, model: torch.nn.Module, executors: str | None) -> Any:
    if system == "eager":
        return model
    if system == "torch.compile":
        return torch.compile(model)
    if system == "torch.compile-regional":
        for block in model.blocks:  # type: ignore[union-attr]
            block.compile()
        return model
    if system == "thunder":
        return _import_thunder().jit(model)
    import fcache

    names = tuple(executors.split(",")) if executors else None
    return fcache.jit(model, executors=names)


def _step(model: Any, tokens: torch.Tensor, train: bool) -> torch.Tensor:
    if not train:
        with torch.no_grad():
            return model(tokens)
    out = model(tokens)
    out.float().square().mean().backward()
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # libraries that assume the current device follow
    cfg = ModelConfig(
        family=args.family,
        layers=args.layers,
        dim=args.dim,
        heads=args.heads,
        vocab=args.vocab,
        max_seq=max(args.seq, 16),
    )
    dtype = DTYPES[args.dtype]
    model = build(cfg).to(device=device, dtype=dtype)
    tokens = sample_tokens(cfg, args.batch, args.seq).to(device)
    train = args.mode == "train"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    system = _prepare(args.system, model, args.executors)
    start = time.perf_counter()
    _step(system, tokens, train)
    _sync(device)
    first = time.perf_counter() - start
    first_done = time.time()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        _step(system, tokens, train)
        _sync(device)
        times.append(time.perf_counter() - start)
    steady = statistics.median(times) if times else None
    result: dict[str, Any] = {
        **vars(args),
        "executors_requested": args.executors,
        "first_step_s": round(first, 4),
        "first_step_done_unix": first_done,
        "steady_step_s": round(steady, 6) if steady is not None else None,
        "torch": torch.__version__,
        **_split(args.system, system, first, steady),
        # ru_maxrss is in KiB on Linux: the process's peak resident memory.
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if device.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    if args.system == "fcache":
        import fcache

        result.update(fcache.stats(system).to_dict())
        if "fcache.executors.nvfuser.runtime" in sys.modules:  # nvFuser built something
            from fcache.executors import registry

            nv = registry.create("nvfuser").stats()
            keys = (
                "compiles", "compile_seconds", "loads", "load_seconds", "nvrtc_compiles",
                "cut_regions", "steps", "late_compiles", "runtime_fallbacks",
            )  # fmt: skip
            result["nvfuser_executor"] = {k: nv[k] for k in keys} | {"declined": nv["declined"]}
    if args.system.startswith("torch.compile"):
        result.update(_inductor_counts())
    if args.system == "thunder":
        result.update(_thunder_info(system))
    if args.check:
        reference = build(cfg).to(device=device, dtype=dtype)
        result.update(_errors(system, model, reference, tokens, train))
    return result


def _split(system: str, compiled: Any, first: float, steady: float | None) -> dict[str, Any]:
    """capture_s / compile_load_s / run_s of the first step (see the module docstring)."""
    compile_load: float | None = None
    capture: float | None = None
    if system == "fcache":
        import fcache

        compile_load = fcache.stats(compiled).graph_seconds
    elif system.startswith("torch.compile"):
        from torch._dynamo.utils import compilation_time_metrics

        compile_load = sum(sum(compilation_time_metrics.get(k, [])) for k in _INDUCTOR_TIMERS)
    elif system == "thunder":
        capture = _thunder_tracing_s(compiled)
    if steady is None or (compile_load is None and capture is None):
        return {}
    if compile_load is None:
        assert capture is not None
        compile_load = first - capture - steady
    elif capture is None:
        capture = first - compile_load - steady
    return {
        "capture_s": round(capture, 4),
        "compile_load_s": round(compile_load, 4),
        "run_s": round(steady, 6),
    }


def _inductor_counts() -> dict[str, int]:
    """Graphs Inductor compiled (FX graph cache misses and bypasses) and graphs it found in its
    cache. Units differ from fcache's `compiles`, which counts regions."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {
        "compiles": inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"],
        "graph_cache_hits": inductor["fxgraph_cache_hit"],
    }


def _thunder_tracing_s(compiled: Any) -> float | None:
    import thunder

    stats = thunder.compile_stats(compiled)
    if stats is None or stats.last_trace_tracing_start < 0:
        return None
    # Counters in ns; after steady steps they describe the last call that traced, the first.
    return (stats.last_trace_tracing_stop - stats.last_trace_tracing_start) / 1e9


def _thunder_info(compiled: Any) -> dict[str, Any]:
    import thunder

    info: dict[str, Any] = {"thunder": getattr(thunder, "__version__", "unknown")}
    try:
        info["thunder_executors"] = [e.name for e in thunder.get_default_executors()]
    except Exception as exc:  # reporting only; the measurement stands without it
        info["thunder_executors"] = f"unknown ({exc})"
    stats = thunder.compile_stats(compiled)
    if stats is not None:
        info["thunder_cache_misses"] = stats.cache_misses
    nvfuser = sys.modules.get("nvfuser_direct")
    if nvfuser is not None:
        info["nvfuser"] = nvfuser.version()
    return info


def _errors(
    system: Any,
    model: torch.nn.Module,
    reference: torch.nn.Module,
    tokens: torch.Tensor,
    train: bool,
) -> dict[str, float]:
    """Largest differences from eager, on one more step: outputs and parameter gradients.
    Steps do not update weights, so `model` and `reference` still hold the same ones."""
    model.zero_grad()
    out = _step(system, tokens, train)
    expected = _step(reference, tokens, train)
    errors = {
        "max_abs_error": float((out.detach().float() - expected.detach().float()).abs().max())
    }
    if train:
        errors["max_grad_error"] = max(
            _grad_error(p.grad, q.grad)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True)
            if q.grad is not None
        )
    return errors


def _grad_error(got: torch.Tensor | None, expected: torch.Tensor) -> float:
    """A gradient eager computes and the system did not is an infinite error."""
    if got is None:
        return float("inf")
    return float((got.float() - expected.float()).abs().max())


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    result = measure(args)
    sys.stdout.flush()
    # The report is the last line, whatever the compilers printed before it.
    os.write(sys.stdout.fileno(), (json.dumps(result, default=str) + "\n").encode())


if __name__ == "__main__":
    main()
