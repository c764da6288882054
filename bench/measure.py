"""One benchmark measurement in a fresh process: `fcache.examples.run` with more systems and
models (what the library's demo runner does not need to know).

    python -m bench.measure --system thunder --family hf-llama --layers 2 --device cuda ...

Systems beyond eager / torch.compile / fcache:
- torch.compile-regional: each block compiled separately (PyTorch's regional recipe);
- torch.compile-nested: the whole model compiled, each block's forward marked with
  `torch.compiler.nested_compile_region` (PyTorch's hierarchical compilation, meant to
  trace one block and reuse it for the others: torch 2.13 does, torch 2.11 still traces
  every block; bench/results/gpu-h100-four-workers-2026-11-26);
- torch.compile-reduce-overhead: torch.compile(mode="reduce-overhead"), CUDA graphs;
- thunder: `thunder.jit` with its default executors (nvFuser among them on CUDA). Thunder
  0.2.6 imports nvFuser under its legacy module name, so `nvfuser_direct` is aliased to
  `nvfuser` first, and it names Tensor methods torch 2.13 removed (named tensors), which
  get stand-ins that raise. Its first step splits into its interpreter's tracing time and
  the rest (transforms and nvFuser's compiles happen inside the first execution).

FCACHE_BENCH_LOG=INFO logs what the systems log (fcache: why a model takes a route, each
fallback) to the process's stderr, which bench.run keeps under its logs.

Families beyond the example models (llama, gpt): Hugging Face models with random weights
(bench/hf.py: hf-llama, hf-gpt2 and the architecture matrix; --vocab applies to the ones
that take it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from bench import hf
from fcache.examples.run import DTYPES, Runner, Workload

# Tensor methods that torch 2.13 removed (named tensors) and Thunder 0.2.6 still names.
_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


class BenchRunner(Runner):
    systems = (
        *Runner.systems,
        "torch.compile-regional",
        "torch.compile-nested",
        "torch.compile-reduce-overhead",
        "fcache-blocks",
        "thunder",
    )
    families = (*Runner.families, *hf.FAMILIES)

    def workload(self, args: argparse.Namespace, device: torch.device) -> Workload:
        if args.family not in hf.FAMILIES:
            return super().workload(args, device)
        dtype = DTYPES[args.dtype]

        def again() -> torch.nn.Module:
            model = hf.build(args.family, args.layers, args.dim, args.heads, args.vocab, args.seq)
            return model.to(device=device, dtype=dtype)

        model = again()
        gen = torch.Generator().manual_seed(1)
        found = hf.inputs(args.family, model, args.batch, args.seq, gen)
        moved = {
            k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
            for k, v in found.items()
        }
        return Workload(model, moved, again)

    def prepare(self, system: str, model: torch.nn.Module, args: argparse.Namespace) -> Any:
        if system == "torch.compile-regional":
            for block in _blocks(model):
                block.compile()
            return model
        if system == "torch.compile-nested":
            _mark_nested(_blocks(model))
            return torch.compile(model)
        if system == "torch.compile-reduce-overhead":
            return torch.compile(model, mode="reduce-overhead")
        if system == "thunder":
            return _import_thunder().jit(model)
        if system == "fcache-blocks":  # the repeated blocks only, traced once for all
            import fcache

            names = tuple(args.executors.split(",")) if args.executors else None
            return fcache.jit(model, executors=names, blocks=True)
        return super().prepare(system, model, args)

    def seconds(self, system: str, compiled: Any) -> tuple[float | None, float | None]:
        if system == "thunder":
            return None, _thunder_tracing_s(compiled)
        return super().seconds(_as_runner(system), compiled)

    def info(self, system: str, compiled: Any) -> dict[str, Any]:
        if system == "thunder":
            return _thunder_info(compiled)
        return super().info(_as_runner(system), compiled)


def _as_runner(system: str) -> str:
    """The base Runner's name of a system whose compiled model reports as that one's."""
    return "fcache" if system == "fcache-blocks" else system


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of an example model or a Hugging Face decoder."""
    for path in ("blocks", "model.layers", "transformer.h"):
        found: Any = model
        for name in path.split("."):
            found = getattr(found, name, None)
        if found is not None:
            return list(found)
    raise ValueError(f"no repeated blocks found in {type(model).__name__}")


def _mark_nested(blocks: list[torch.nn.Module]) -> None:
    """Mark each block's forward as one nested compile region, on the instances (the
    class stays as it was). One marked function is shared by all blocks: Dynamo keys its
    reuse of a traced block by the function."""
    marked = torch.compiler.nested_compile_region(type(blocks[0]).forward)
    for block in blocks:
        if type(block) is not type(blocks[0]):
            raise ValueError(
                f"blocks of two classes: {type(blocks[0]).__name__}, {type(block).__name__}"
            )
        block.forward = types.MethodType(marked, block)


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


if __name__ == "__main__":
    if level := os.environ.get("FCACHE_BENCH_LOG"):  # e.g. INFO: why a route was taken
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    BenchRunner().main()
