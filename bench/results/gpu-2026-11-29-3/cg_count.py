"""How many CUDA graphs the tree records and replays per generate call, batch 8, static cache,
256 new tokens: Transformers' reduce-overhead ("ro") against fcache's ("fcg"), a process each.
argv: system."""
import argparse, os, sys, time, collections
sys.path.insert(0, ".")
import torch
from torch._inductor import cudagraph_trees as ct
from bench import generate as g

counts = collections.Counter()
for name in ("record_function", "execute_node", "run_eager"):
    orig = getattr(ct.CUDAGraphTreeManager, name, None)
    if orig is None:
        print("no", name); continue
    def wrap(self, *a, _orig=orig, _name=name, **k):
        counts[_name] += 1
        return _orig(self, *a, **k)
    setattr(ct.CUDAGraphTreeManager, name, wrap)
system = sys.argv[1]
N = 256
args = argparse.Namespace(family="hf-llama", layers=4, dim=1024, heads=16, vocab=32000, prompt=128,
                          new_tokens=N, device="cuda", dtype="bfloat16")
model, ids = g.build(args, 8)
opts = dict(max_new_tokens=N, do_sample=False, use_cache=True, disable_compile=True,
            attention_mask=torch.ones_like(ids), cache_implementation="static")
if system == "ro":
    opts["disable_compile"] = False; gen = model.generate
else:
    import fcache
    gen = fcache.jit(model).generate
def cache_ptr():
    c = getattr(model, "_cache", None)
    try:
        return c.layers[0].keys.data_ptr()
    except Exception:
        return None
seen = []
with torch.no_grad():
    for call in range(5):
        before = dict(counts)
        t = time.perf_counter(); gen(ids, **opts); torch.cuda.synchronize(); wall = time.perf_counter() - t
        diff = {k: counts[k] - before.get(k, 0) for k in counts}
        m = ct.get_manager(0, create_if_none_exists=False)
        roots = sum(len(v) for v in m.roots.values()) if m else None
        p = cache_ptr()
        print(f"{system} call {call}: {wall:.3f} s, {diff}, roots {roots}, model._cache keys: {'none' if p is None else ('reused' if p in seen else 'new')}", flush=True)
        seen.append(p)
