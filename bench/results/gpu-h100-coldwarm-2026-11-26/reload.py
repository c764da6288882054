"""Is a cold process's steady step slower than a warm one's, and if so, what in the process?

One process, six windows of 20 timed steps (each after 5 untimed), in this order:
A as the process started (cold or warm, by the cache directories it is given), B with the
backward on the calling thread, C with what the process made so far moved out of Python's
collector (gc.freeze), A2 as started again, D after everything fcache and Dynamo hold is
dropped and the model compiled again in this process (a cold process then loads from the
disk what it compiled: its state, not its compiled objects, stays), E as D on one thread.

    python reload.py FAMILY LAYERS LABEL     # from the repository root, PYTHONPATH=.

Per window: the median step (ms), the host time until the backward call returned
(`host_ms`) and until the forward returned (`fwd_host_ms`). The last line, after
`RESULT `, is the whole record as JSON. DEV=cpu runs a tiny model (a smoke test).
"""

import gc
import json
import os
import resource
import statistics
import sys
import threading
import time

import torch

import fcache
from bench import hf

family, layers, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
device = os.environ.get("DEV", "cuda")
cuda = device == "cuda"
dim, seq, heads = (1024, 2048, 16) if cuda else (64, 64, 4)
torch.manual_seed(0)
model = hf.build(family, layers, dim, heads, 32000, seq)
model = model.to(device, torch.bfloat16 if cuda else torch.float32)
tokens = torch.randint(0, hf.vocab_size(model), (2, seq), device=device)
sync = torch.cuda.synchronize if cuda else (lambda: None)


def window(fn, steps=20):
    def step():
        model.zero_grad(set_to_none=True)
        fn(tokens).logits.float().pow(2).mean().backward()

    start = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - start
    for _ in range(5):
        step()
    sync()
    times, host, forward = [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        model.zero_grad(set_to_none=True)
        out = fn(tokens)
        forward.append(time.perf_counter() - start)
        out.logits.float().pow(2).mean().backward()
        host.append(time.perf_counter() - start)
        sync()
        times.append(time.perf_counter() - start)

    def ms(xs):
        return round(statistics.median(xs) * 1e3, 2)

    return {
        "first_s": round(first, 2),
        "steady_ms": ms(times),
        "host_ms": ms(host),
        "fwd_host_ms": ms(forward),
        "range": [round(min(times) * 1e3, 2), round(max(times) * 1e3, 2)],
    }


def show(name, result):
    print(label, name, result, flush=True)
    return result


record = {"label": label, "family": family, "layers": layers}
start = time.perf_counter()
fn = fcache.jit(model)
record["A"] = show("A", window(fn) | {"start_s": round(time.perf_counter() - start, 2)})
record["compiles"] = fcache.stats(fn).compiles
record["threads"] = sorted(t.name for t in threading.enumerate())
record["gc_objects"] = len(gc.get_objects())
record["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
torch.autograd.set_multithreading_enabled(False)
record["B_one_thread"] = show("B", window(fn))
torch.autograd.set_multithreading_enabled(True)
gc.collect()
gc.freeze()
record["C_frozen"] = show("C", window(fn))
gc.unfreeze()
record["A2_again"] = show("A2", window(fn))
del fn
torch._dynamo.reset()
fcache.process.reset()
gc.collect()
start = time.perf_counter()
fn = fcache.jit(model)
record["D_reloaded"] = show("D", window(fn) | {"start_s": round(time.perf_counter() - start, 2)})
record["D_compiles"] = fcache.stats(fn).compiles
torch.autograd.set_multithreading_enabled(False)
record["E_reloaded_one_thread"] = show("E", window(fn))
torch.autograd.set_multithreading_enabled(True)
record["threads_end"] = sorted(t.name for t in threading.enumerate())
print("RESULT " + json.dumps(record), flush=True)
