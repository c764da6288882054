"""Forward host time in different contexts (this process).

PYTHONPATH=. python ablate2.py SYSTEM LAYERS [FAMILY]
"""

import json
import statistics
import sys
import threading
import time

import torch

from bench import hf

system, layers = sys.argv[1], int(sys.argv[2])
family = sys.argv[3] if len(sys.argv) > 3 else "hf-llama"
torch.manual_seed(0)
model = hf.build(family, layers, 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
tokens = torch.randint(0, hf.vocab_size(model), (2, 2048), device="cuda")
if system == "fcache":
    import fcache

    fn = fcache.jit(model)
else:
    fn = torch.compile(model)


def fwd():
    return fn(tokens).logits


def timed(n, before=None, backward=True, sleep=0.0):
    f, b = [], []
    for _ in range(n):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if sleep:
            time.sleep(sleep)
        s = time.perf_counter()
        out = fwd()
        f.append(time.perf_counter() - s)
        if backward:
            loss = out.float().pow(2).mean()
            torch.cuda.synchronize()
            s = time.perf_counter()
            loss.backward()
            b.append(time.perf_counter() - s)
            del loss
        torch.cuda.synchronize()
        del out

    def med(x):
        return round(statistics.median(x) * 1e3, 3) if x else None

    return {"fwd_host": med(f), "bwd_host": med(b)}


for _ in range(6):
    model.zero_grad(set_to_none=True)
    fwd().float().pow(2).mean().backward()
torch.cuda.synchronize()
res = {
    "system": system,
    "layers": layers,
    "family": family,
    "threads": [t.name for t in threading.enumerate()],
}
res["fwd_only"] = timed(15, backward=False)
res["step"] = timed(15)
res["step_sleep20ms"] = timed(15, sleep=0.02)
res["fwd_only_again"] = timed(15, backward=False)
torch.autograd.set_multithreading_enabled(False)
res["step_1thread"] = timed(15)
res["fwd_only_1thread"] = timed(15, backward=False)
torch.autograd.set_multithreading_enabled(True)
res["step_again"] = timed(15)
print(json.dumps(res), flush=True)
