"""Forward host time of a Llama training step, with parts taken out (this process).

PYTHONPATH=. python ablate.py SYSTEM LAYERS   # one JSON line; SYSTEM: fcache or tc
"""
# ruff: noqa: E402  (imports where the experiments need them)

import json
import statistics
import sys
import time

import torch

from bench import hf

system, layers = sys.argv[1], int(sys.argv[2])
family = sys.argv[3] if len(sys.argv) > 3 else "hf-llama"
gms = []
if system == "fcache":
    import fcache
    import fcache.engine.stitch as st

    orig = st.fx.GraphModule

    class GM(orig):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            gms.append(self)

    st.fx.GraphModule = GM
torch.manual_seed(0)
model = hf.build(family, layers, 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
tokens = torch.randint(0, hf.vocab_size(model), (2, 2048), device="cuda")
fn = fcache.jit(model) if system == "fcache" else torch.compile(model)


def step():
    model.zero_grad(set_to_none=True)
    fn(tokens).logits.float().pow(2).mean().backward()


for _ in range(6):
    step()
torch.cuda.synchronize()


def fwd_host(n=15):
    t = []
    for _ in range(n):
        torch.cuda.synchronize()
        s = time.perf_counter()
        out = fn(tokens)
        t.append(time.perf_counter() - s)
        del out
    torch.cuda.synchronize()
    return round(statistics.median(t) * 1e3, 3)


res = {"system": system, "layers": layers, "family": family, "as_is": fwd_host()}
# regions answered from a record of their outputs, nothing run
mode = {"fake": False}
if system == "fcache":
    patched = 0
    for gm in gms:
        g = gm.forward.__globals__
        for name, target in list(g.items()):
            if name.startswith("fcache_engine_stitch_region") and callable(target):

                def make(real):
                    memo = {}

                    def region(inputs):
                        if mode["fake"] and "out" in memo:
                            inputs.clear()
                            return memo["out"]
                        out = real(inputs)
                        memo["out"] = out
                        return out

                    return region

                g[name] = make(target)
                patched += 1
    res["patched_regions"] = patched
    fwd_host(3)
    mode["fake"] = True
    res["regions_faked"] = fwd_host()
    mode["fake"] = False
from torch._inductor.runtime.triton_heuristics import CachingAutotuner

real_run = CachingAutotuner.run
calls = {"n": 0}


def counting(self, *a, **k):
    calls["n"] += 1
    return real_run(self, *a, **k)


CachingAutotuner.run = counting
fwd_host(1)
res["launches_per_fwd"] = calls["n"]
CachingAutotuner.run = lambda self, *a, stream, **k: None
res["launches_skipped"] = fwd_host()
CachingAutotuner.run = real_run
# micro-costs on this host, us
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
from torch._C._dynamo.guards import _empty_strided_cuda


def micro(f, n=20000):
    best = 1e9
    for _ in range(5):
        s = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - s) / n * 1e6)
    return round(best, 3)


def guard():
    with torch.cuda._DeviceGuard(0):
        torch.cuda.set_device(0)


res["us"] = {
    "guard+set_device": micro(guard),
    "empty_strided_cuda": micro(
        lambda: _empty_strided_cuda((2048, 1024), (1024, 1), torch.bfloat16)
    ),
    "get_raw_stream": micro(lambda: get_raw_stream(0)),
    "reinterpret": micro(
        lambda: torch._C._dynamo.guards._reinterpret_tensor(tokens, [4096], [1], 0)
    ),
    "mm_op": micro(lambda: torch.ops.aten.mm.default(a, b), 5000)
    if (a := torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)) is not None
    and (b := a) is not None
    else 0,
    "mm": micro(lambda: torch.mm(a, b), 5000),
}
print(json.dumps(res), flush=True)
