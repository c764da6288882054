"""Page faults and time per steady step of one fcache process (CPU, Hugging Face GPT-2 with
its 50257-word vocabulary: 12.9 MB logits a step). Run it twice with one FCACHE_DIR: the
first process compiles (cold), the second loads everything (warm).

    FCACHE_DIR=/tmp/faults-cache python bench/results/cpu-heap-2026-11-26/step_faults.py cold
    FCACHE_DIR=/tmp/faults-cache python bench/results/cpu-heap-2026-11-26/step_faults.py warm
"""

import resource
import statistics
import sys
import time

import torch

import fcache
from bench import hf

torch.manual_seed(0)
model = hf.build("hf-gpt2", 8, 64, 4, 512, 64)
tokens = torch.randint(0, 50257, (1, 64))
compiled = fcache.jit(model)


def step() -> None:
    for p in model.parameters():
        p.grad = None
    logits = compiled(input_ids=tokens).logits
    loss = torch.nn.functional.cross_entropy(
        logits.view(-1, logits.shape[-1]).float(), tokens.view(-1)
    )
    loss.backward()


for _ in range(5):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
times = []
for _ in range(20):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 20
median_ms = statistics.median(times) * 1e3
print(f"{sys.argv[1]}: {faults:.0f} page faults a step, median step {median_ms:.2f} ms")
