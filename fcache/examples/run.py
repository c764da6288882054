"""One measurement: an example model under one system, first step and steady steps, as JSON.

    python -m fcache.examples.run --system fcache --layers 2 --dim 64

Meant to run in a fresh process (that is what "first step" means), launched by
`fcache demo`; bench/measure.py extends it (more systems and models) through `Runner`.
The last line of stdout is one JSON object: start_s (from the torch.compile / fcache.jit
call to the end of the first step: what a user waits for), wrap_s (that call alone: it
imports the compiler), first_step_s (the first step alone), steady_step_s (median),
compiles, unique_regions, regions, peak_memory_bytes (CUDA), peak_rss_bytes, max_abs_error
(outputs against eager, when --check), the split of the first step below,
first_step_done_unix (wall clock when the first step ended, for runs of several processes
at once), plus the configuration.

Systems: eager; torch.compile (Inductor, whole model); fcache.

The first step is split where the system exposes it (see `Runner.split`):
- compile_load_s: wall time spent compiling or loading graphs. fcache: its own
  `graph_seconds` (`fcache.stats`: partition, keys, cache look-ups, compiles, loads).
  torch.compile: Inductor's own `compile_fx_inner` timer (one entry per
  forward/backward graph) plus its `AOTAutogradCache.inductor_load` timer (a warm
  AOTAutograd cache loads graphs without compile_fx_inner).
- run_s: the median steady step, standing in for the first step's own computation.
- capture_s: what is left, first_step_s - compile_load_s - run_s: Dynamo, AOTAutograd
  tracing and the rest of the framework's work, including compile work a system defers to
  the first execution (autotuning, lazily built kernels).
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
from dataclasses import dataclass
from typing import Any

import torch

from fcache.examples.models import ModelConfig, build, sample_tokens

SYSTEMS = ("eager", "torch.compile", "fcache")
FAMILIES = ("llama", "gpt")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Inductor's timers (torch._dynamo.utils.compilation_time_metrics) of compiling a graph and of
# loading one from a warm AOTAutograd cache, which skips compile_fx_inner.
_INDUCTOR_TIMERS = ("compile_fx_inner", "AOTAutogradCache.inductor_load")


@dataclass
class Workload:
    """A model, the inputs of one step (token ids, or the keyword arguments of a model that
    takes others), and how to build the same model again (same weights) for --check."""

    model: torch.nn.Module
    tokens: torch.Tensor | dict[str, torch.Tensor]
    again: Callable[[], torch.nn.Module]


class Runner:
    """The systems and models one measurement knows; bench/measure.py subclasses it."""

    systems: tuple[str, ...] = SYSTEMS
    families: tuple[str, ...] = FAMILIES

    def parser(self) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        p.add_argument("--system", choices=self.systems, required=True)
        p.add_argument("--family", choices=self.families, default=self.families[0])
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

    def workload(self, args: argparse.Namespace, device: torch.device) -> Workload:
        cfg = ModelConfig(
            family=args.family,
            layers=args.layers,
            dim=args.dim,
            heads=args.heads,
            vocab=args.vocab,
            max_seq=max(args.seq, 16),
        )
        dtype = DTYPES[args.dtype]

        def again() -> torch.nn.Module:
            return build(cfg).to(device=device, dtype=dtype)

        return Workload(again(), sample_tokens(cfg, args.batch, args.seq).to(device), again)

    def prepare(self, system: str, model: torch.nn.Module, args: argparse.Namespace) -> Any:
        if system == "eager":
            return model
        if system == "torch.compile":
            return torch.compile(model)
        if system == "fcache":
            import fcache

            names = tuple(args.executors.split(",")) if args.executors else None
            return fcache.jit(model, executors=names)
        raise ValueError(f"unknown system {system!r}")

    def seconds(self, system: str, compiled: Any) -> tuple[float | None, float | None]:
        """(compile_load_s, capture_s) of the first step where the system says (module doc)."""
        if system == "fcache":
            import fcache

            return fcache.stats(compiled).graph_seconds, None
        if system.startswith("torch.compile"):
            from torch._dynamo.utils import compilation_time_metrics

            timers = compilation_time_metrics
            return sum(sum(timers.get(k, [])) for k in _INDUCTOR_TIMERS), None
        return None, None

    def info(self, system: str, compiled: Any) -> dict[str, Any]:
        """What the system reports of itself (fcache's counters, Inductor's compiles)."""
        if system == "fcache":
            return _fcache_info(compiled)
        if system.startswith("torch.compile"):
            return _inductor_counts()
        return {}

    def split(
        self, system: str, compiled: Any, first: float, steady: float | None
    ) -> dict[str, Any]:
        """capture_s / compile_load_s / run_s of the first step (see the module docstring)."""
        compile_load, capture = self.seconds(system, compiled)
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

    def measure(self, args: argparse.Namespace) -> dict[str, Any]:
        device = torch.device(args.device)
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # libraries that assume the current device follow
        work = self.workload(args, device)
        train = args.mode == "train"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        system = self.prepare(args.system, work.model, args)
        wrap = time.perf_counter() - start

        def step() -> None:
            # As a training loop does (optimizer.zero_grad): each step's gradients are new
            # tensors, not sums into the last step's (which CUDA graphs may overwrite).
            work.model.zero_grad(set_to_none=True)
            _step(system, work.tokens, train)

        start = time.perf_counter()
        step()
        _sync(device)
        first = time.perf_counter() - start
        first_done = time.time()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        steady = statistics.median(times) if times else None
        result: dict[str, Any] = {
            **vars(args),
            "executors_requested": args.executors,
            "start_s": round(wrap + first, 4),
            "wrap_s": round(wrap, 4),
            "first_step_s": round(first, 4),
            "first_step_done_unix": first_done,
            "steady_step_s": round(steady, 6) if steady is not None else None,
            "steady_steps_s": [round(t, 6) for t in times],
            "torch": torch.__version__,
            **self.split(args.system, system, first, steady),
            # ru_maxrss is in KiB on Linux: the process's peak resident memory.
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        if device.type == "cuda":
            result["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        result.update(self.info(args.system, system))
        if args.check:
            result.update(_errors(system, work.model, work.again(), work.tokens, train))
        return result

    def main(self, argv: list[str] | None = None) -> None:
        args = self.parser().parse_args(argv)
        result = self.measure(args)
        sys.stdout.flush()
        # The report is the last line, whatever the compilers printed before it.
        os.write(sys.stdout.fileno(), (json.dumps(result, default=str) + "\n").encode())


def _step(model: Any, tokens: torch.Tensor | dict[str, torch.Tensor], train: bool) -> torch.Tensor:
    def call() -> torch.Tensor:
        return _logits(model(**tokens) if isinstance(tokens, dict) else model(tokens))

    if not train:
        with torch.no_grad():
            return call()
    out = call()
    out.float().square().mean().backward()
    return out


def _logits(output: Any) -> torch.Tensor:
    """A model's logits: the output itself, or its `.logits` (Hugging Face models)."""
    return output if isinstance(output, torch.Tensor) else output.logits


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fcache_info(compiled: Any) -> dict[str, Any]:
    import fcache

    info: dict[str, Any] = fcache.stats(compiled).to_dict()
    if "fcache.executors.nvfuser.runtime" in sys.modules:  # nvFuser built something
        from fcache.executors import registry

        nv = registry.create("nvfuser").stats()
        keys = (
            "compiles", "compile_seconds", "loads", "load_seconds", "nvrtc_compiles",
            "cut_regions", "steps", "late_compiles", "runtime_fallbacks",
        )  # fmt: skip
        info["nvfuser_executor"] = {k: nv[k] for k in keys} | {"declined": nv["declined"]}
    return info


def _inductor_counts() -> dict[str, int]:
    """Graphs Inductor compiled (FX graph cache misses and bypasses) and graphs it found in its
    cache. Units differ from fcache's `compiles`, which counts regions."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {
        "compiles": inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"],
        "graph_cache_hits": inductor["fxgraph_cache_hit"],
    }


def _errors(
    system: Any,
    model: torch.nn.Module,
    reference: torch.nn.Module,
    tokens: torch.Tensor | dict[str, torch.Tensor],
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
    Runner().main(argv)


if __name__ == "__main__":
    main()
