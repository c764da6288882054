"""One process, the same weights: eager, torch.compile (model.forward compiled, default mode)
and fcache.jit(model).generate, alternating call by call after a warm-up, so that a busy
host's drift falls on all three alike. Prints one JSON line per batch size and cache.

    OMP_NUM_THREADS=1 PYTHONPATH=. python bench/results/cpu-generate-2026-11-28/ab.py
"""

import json
import statistics
import time

import torch

import fcache
from bench import generate as g

args = g.parser().parse_args(
    "--device cpu --layers 2 --dim 128 --heads 4 --vocab 1024 --prompt 128 --new-tokens 256 "
    "--dtype float32".split()
)
for cache, batch in (("dynamic", 1), ("dynamic", 8), ("static", 1)):
    torch._dynamo.reset()
    model, ids = g.build(args, batch)
    tc_model, _ = g.build(args, batch)
    tc_model.forward = torch.compile(tc_model.forward)
    compiled = fcache.jit(model)
    opts = dict(max_new_tokens=256, do_sample=False, use_cache=True, disable_compile=True,
                attention_mask=torch.ones_like(ids))  # fmt: skip
    if cache == "static":
        opts["cache_implementation"] = "static"
    systems = {"eager": model.generate, "torch.compile": tc_model.generate,
               "fcache": compiled.generate}  # fmt: skip
    outs, times = {}, {name: [] for name in systems}
    with torch.no_grad():
        for name, fn in systems.items():  # warm-up: every compile here
            outs[name] = fn(ids, **opts)
        for i in range(7):
            for name in list(systems)[i % 3 :] + list(systems)[: i % 3]:
                t = time.perf_counter()
                systems[name](ids, **opts)
                times[name].append(time.perf_counter() - t)
    rate = {n: batch * 256 / statistics.median(v) for n, v in times.items()}
    print(json.dumps({
        "cache": cache, "batch": batch,
        "tokens_per_s": {n: round(r, 1) for n, r in rate.items()},
        "fcache_vs_torch_compile": round(rate["fcache"] / rate["torch.compile"], 3),
        "same_tokens": all(torch.equal(outs["eager"], o) for o in outs.values()),
        "graphs": fcache.stats(compiled).graphs,
        "calls_s": {n: [round(x, 4) for x in v] for n, v in times.items()},
    }), flush=True)
