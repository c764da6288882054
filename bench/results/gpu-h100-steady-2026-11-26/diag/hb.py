"""Host-bound diagnosis: steady steps (wall, and host time to the step's return), then
torch.profiler over 10 steps (CPU ops by self time, CUDA runtime calls), then cProfile over
20 steps (Python by tottime). Batch 1 x 256 unless given.

    PYTHONPATH=. python hb.py fcache|tc FAMILY LAYERS OUT_PREFIX [BATCH SEQ]
"""

import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import hf

system, fam, layers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
batch, seq = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (1, 256)
torch.manual_seed(0)
model = hf.build(fam, layers, 1024, 16, 32000, seq).to("cuda", torch.bfloat16)
tokens = torch.randint(0, hf.vocab_size(model), (batch, seq), device="cuda")
t0 = time.perf_counter()
if system == "tc":
    fn = torch.compile(model)
else:
    import fcache

    fn = fcache.jit(model)


def step() -> None:
    model.zero_grad(set_to_none=True)
    fn(tokens).logits.float().pow(2).mean().backward()


step()
torch.cuda.synchronize()
first = time.perf_counter() - t0
for _ in range(10):
    step()
torch.cuda.synchronize()
wall, host = [], []
for _ in range(40):
    s = time.perf_counter()
    step()
    h = time.perf_counter() - s
    torch.cuda.synchronize()
    wall.append(1e3 * (time.perf_counter() - s))
    host.append(1e3 * h)
res = {
    "system": system, "family": fam, "layers": layers, "first_s": round(first, 2),
    "wall_ms": round(statistics.median(wall), 3), "host_ms": round(statistics.median(host), 3),
}  # fmt: skip
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
ka = prof.key_averages()
rows = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:40]
res["cpu_ops"] = [(e.key, e.count // 10, round(e.self_cpu_time_total / 10 / 1e3, 3)) for e in rows]
res["cuda_kernels_per_step"] = (
    sum(e.count for e in ka if e.device_time_total > 0 and e.key and not e.key.startswith("cuda"))
    // 10
)
res["gpu_ms_per_step"] = round(sum(e.self_device_time_total for e in ka) / 10 / 1e3, 3)
res["runtime"] = [
    (e.key, e.count // 10, round(e.self_cpu_time_total / 10 / 1e3, 3))
    for e in ka
    if e.key.startswith("cu")
]
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    step()
torch.cuda.synchronize()
pr.disable()
text = io.StringIO()
pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(45)
res["cprofile"] = text.getvalue()[-9000:]
with open(out + ".json", "w") as f:
    json.dump(res, f, indent=1)
keys = ("system", "family", "layers", "first_s", "wall_ms", "host_ms", "gpu_ms_per_step",
        "cuda_kernels_per_step")  # fmt: skip
print(json.dumps({k: res[k] for k in keys}), flush=True)
print("runtime", res["runtime"][:12], flush=True)
