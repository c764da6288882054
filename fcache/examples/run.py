"""One measurement: an example model under one system, first step and steady steps, as JSON.

    python -m fcache.examples.run --system fcache --layers 2 --dim 64

Meant to run in a fresh process (that is what "first step" means), launched by
`fcache demo` and by bench/. The last line of stdout is one JSON object:
first_step_s, steady_step_s (median), compiles, unique_regions, regions, peak_memory_bytes,
max_abs_error (outputs against eager, when --check), plus the configuration.

Systems: eager; torch.compile (Inductor, whole model); torch.compile-regional (each block
compiled separately, PyTorch's regional-compilation recipe); fcache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

from fcache.examples.models import ModelConfig, build, sample_tokens

SYSTEMS = ("eager", "torch.compile", "torch.compile-regional", "fcache")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _prepare(system: str, model: torch.nn.Module, executors: str | None) -> Any:
    if system == "eager":
        return model
    if system == "torch.compile":
        return torch.compile(model)
    if system == "torch.compile-regional":
        for block in model.blocks:  # type: ignore[union-attr]
            block.compile()
        return model
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
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        _step(system, tokens, train)
        _sync(device)
        times.append(time.perf_counter() - start)
    result: dict[str, Any] = {
        **vars(args),
        "first_step_s": round(first, 4),
        "steady_step_s": round(statistics.median(times), 6) if times else None,
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        result["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    if args.system == "fcache":
        import fcache

        result.update(fcache.stats(system).to_dict())
    if args.check:
        reference = build(cfg).to(device=device, dtype=dtype)
        result.update(_errors(system, model, reference, tokens, train))
    return result


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
            float((p.grad.float() - q.grad.float()).abs().max())
            for p, q in zip(model.parameters(), reference.parameters(), strict=True)
            if q.grad is not None
        )
    return errors


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    result = measure(args)
    sys.stdout.flush()
    # The report is the last line, whatever the compilers printed before it.
    os.write(sys.stdout.fileno(), (json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    main()
