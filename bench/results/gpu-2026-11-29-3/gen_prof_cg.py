"""Where a decode step goes with CUDA graphs at batch N: Transformers' reduce-overhead decode
compile ("ro") against fcache with FCACHE_CUDA_GRAPHS=1 ("fcg"), both with a static cache,
one system per process: GPU kernel time, kernels, wall per token. argv: system batch."""
import argparse, collections, os, sys, time
sys.path.insert(0, ".")
import torch, transformers
from bench import generate as g

system, batch = sys.argv[1], int(sys.argv[2])
N = int(os.environ.get("GEN_TOKENS", "64"))  # new tokens a call
args = argparse.Namespace(family="hf-llama", layers=4, dim=1024, heads=16, vocab=32000, prompt=128,
                          new_tokens=N, device="cuda", dtype="bfloat16")
model, ids = g.build(args, batch)
opts = dict(max_new_tokens=N, do_sample=False, use_cache=True, disable_compile=True,
            attention_mask=torch.ones_like(ids), cache_implementation="static")
if system == "ro":
    opts["disable_compile"] = False; gen = model.generate
else:
    assert os.environ.get("FCACHE_CUDA_GRAPHS") == "1"
    import fcache
    gen = fcache.jit(model).generate
with torch.no_grad():
    gen(ids, **opts); gen(ids, **opts); torch.cuda.synchronize()
    walls = []
    for _ in range(5):
        t = time.perf_counter(); gen(ids, **opts); torch.cuda.synchronize(); walls.append(time.perf_counter() - t)
    wall = sorted(walls)[2]
    print("calls", [round(w, 4) for w in walls])
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        gen(ids, **opts); torch.cuda.synchronize()
kern = collections.Counter(); count = collections.Counter(); host = collections.Counter()
for e in p.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kern[e.name[:100]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        count[e.name[:100]] += 1
    else:
        host[e.name[:60]] += e.self_cpu_time_total
total = sum(kern.values())
print(f"== {system} batch {batch}: wall {wall*1e3:.1f} ms for {N} tokens ({wall/N*1e3:.3f} ms/token), "
      f"GPU kernel time {total/1e3:.1f} ms ({total/1e3/N:.3f} ms/token), kernels {sum(count.values())} ({sum(count.values())/N:.0f}/token)")
for name, us in kern.most_common(16):
    print(f"  {us/1e3:8.2f} ms {count[name]:6d}x  {name}")
if len(sys.argv) > 3:  # every kernel: GPU us per token, launches per token
    import json
    json.dump({n: [round(kern[n] / N, 2), round(count[n] / N, 2)] for n in sorted(kern, key=lambda n: -count[n])},
              open(sys.argv[3], "w"), indent=0)
print("  host, self time:")
for name, us in host.most_common(12):
    print(f"  {us/1e3:8.2f} ms  {name}")
