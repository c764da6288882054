"""Host cost per step on a model small enough that the host bounds it, with a cProfile.

    python bench/results/gpu-h100-slots-steady-2026-11-26/hostprof/hostprof.py MODE 16 hf-llama

MODE: eager, tc (torch.compile), whole (fcache.jit) or blocks (fcache.jit, blocks=True).
Run from the repository root (PYTHONPATH=.), with FCACHE_DIR and TORCHINDUCTOR_CACHE_DIR set.
"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

import fcache
from bench import hf

mode, layers, family = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dev = torch.device(sys.argv[4] if len(sys.argv) > 4 else "cuda")
torch.manual_seed(0)
model = hf.build(family, layers, 256, 4, 1024, 128).to(dev, torch.bfloat16)
tokens = torch.randint(0, 1024, (1, 128), device=dev)
fn = {
    "eager": lambda: model,
    "tc": lambda: torch.compile(model),
    "whole": lambda: fcache.jit(model),
    "blocks": lambda: fcache.jit(model, blocks=True),
}[mode]()


def step() -> None:
    out = fn(tokens, labels=tokens)
    out.loss.backward()


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


for _ in range(3):
    step()
sync()
times = []
for _ in range(5):
    start = time.perf_counter()
    for _ in range(20):
        step()
    sync()
    times.append((time.perf_counter() - start) / 20)
print(mode, family, layers, "step ms", round(statistics.median(times) * 1e3, 3), flush=True)
profile = cProfile.Profile()
profile.enable()
for _ in range(20):
    step()
sync()
profile.disable()
for order, rows, lines in (("tottime", 25, 60), ("cumulative", 40, 70)):
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats(order).print_stats(rows)
    print("\n".join(line[:170] for line in text.getvalue().splitlines()[:lines]))
