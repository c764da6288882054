"""One training step of the Llama-style example model through fcache's nvFuser executor,
in a process of its own, reported as JSON: how a cold or a warm process spends its time.

    python tests/gpu/nvfuser_run.py --cache-dir DIR --out report.json [--layers 2 ...]
    python tests/gpu/nvfuser_run.py --summarize-trace trace.json

Run it twice on one cache directory: the first process compiles (cold), the second loads
(warm). With NVFUSER_TRACE=path in the environment nvFuser writes a Chrome trace of its
own scopes; `--summarize-trace` adds up the time per scope (segmentation, heuristics,
lowering, code generation, NVRTC, kernel_db look-ups), which is what a warm load still pays.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# Scopes worth reporting, outermost first (csrc/runtime, csrc/fusion_segmenter.cpp, ...).
SCOPES = (
    "FusionExecutorCache::runFusionWithInputs",
    "FusionKernelRuntime::FusionKernelRuntime",
    "PreSegmenter::runPass",
    "SegmentCandidateFinder::SegmentCandidateFinder",
    "FusionKernelRuntime::getMaybeHeuristicsFor",
    "FusionKernelRuntime::compileFusionParallel",
    "KernelExecutor::compile",
    "GpuLower::lower",
    "generateCudaKernel",
    "executor_utils::NVRTC",
    "KernelDb::query",
    "executor_utils::Nvrtc::CompileProgram",
    "executor_utils::Nvrtc::LoadPTX",
)
_EVENT = re.compile(r'"name": "([^"]*)", "ph": "([BE])", "pid": \d+, "tid": (\d+), "ts": ([\d.]+)')


def summarize_trace(path: Path, top: int = 25) -> dict[str, Any]:
    """Seconds per scope: those of SCOPES, then the `top` largest of any name (nested calls
    of one scope counted once), and each segmentation's seconds in order (one per fusion
    built, in the order fcache built them)."""
    stacks: dict[str, list[tuple[str, float]]] = defaultdict(list)
    total: dict[str, float] = defaultdict(float)
    segmentations: list[float] = []
    for line in path.read_text(errors="replace").splitlines():
        match = _EVENT.search(line)
        if not match:
            continue
        name, phase, tid, ts = match.group(1), match.group(2), match.group(3), float(match.group(4))
        stack = stacks[tid]
        if phase == "B":
            stack.append((name, ts))
            continue
        while stack:
            opened, start = stack.pop()
            if opened == name:
                if all(n != name for n, _ in stack):
                    total[name] += (ts - start) / 1e6
                    if name == "SegmentCandidateFinder::SegmentCandidateFinder":
                        segmentations.append(round((ts - start) / 1e6, 3))
                break
    largest = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return {
        "scopes": {name: round(total.get(name, 0.0), 4) for name in SCOPES},
        "largest": {name: round(seconds, 4) for name, seconds in largest},
        "segmentations": segmentations,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import fcache
    from fcache.examples.models import ModelConfig, build, sample_tokens
    from fcache.executors import registry

    cfg = ModelConfig(
        family="llama",
        layers=args.layers,
        dim=args.dim,
        heads=args.heads,
        vocab=args.vocab,
        max_seq=args.seq,
    )
    model = build(cfg).to(device="cuda", dtype=torch.bfloat16)
    tokens = sample_tokens(cfg, args.batch, args.seq).cuda()
    settings = fcache.Settings(
        cache_dir=Path(args.cache_dir), compile_workers=args.workers, progress=False
    )
    compiled = fcache.jit(model, executors=["nvfuser", "eager"], settings=settings)
    torch.cuda.synchronize()
    start = time.perf_counter()
    loss = compiled(tokens).float().sum()
    loss.backward()
    torch.cuda.synchronize()
    first_step = time.perf_counter() - start
    grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
    return {
        "config": vars(args),
        "first_step_seconds": round(first_step, 3),
        # What the step computed, to compare processes (a cold and a warm one must agree).
        "loss": loss.item(),
        "grad_abs_sum": sum(g.abs().sum().item() for g in grads),
        "fcache": fcache.stats(compiled).to_dict(),
        "nvfuser": registry.create("nvfuser").stats(),
        "toolchain": dict(registry.create("nvfuser").toolchain(None)),  # type: ignore[arg-type]
        "device": torch.cuda.get_device_name(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir")
    parser.add_argument("--out")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--summarize-trace")
    args = parser.parse_args(argv)
    if args.summarize_trace:
        report: dict[str, Any] = summarize_trace(Path(args.summarize_trace))
    else:
        report = run(args)
    text = json.dumps(report, indent=1, sort_keys=True, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
