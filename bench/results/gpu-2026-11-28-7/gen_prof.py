"""Where a decode step goes at batch N: torch.compile against fcache (GPU kernel time,
launches, host time per token), one system per process. argv: system batch."""
import argparse, collections, sys, time
sys.path.insert(0, ".")
import torch, transformers
from bench import generate as g

system, batch = sys.argv[1], int(sys.argv[2])
args = argparse.Namespace(family="hf-llama", layers=4, dim=1024, heads=16, vocab=32000, prompt=128,
                          new_tokens=64, device="cuda", dtype="bfloat16")
model, ids = g.build(args, batch)
if system == "tc":
    model.forward = torch.compile(model.forward); gen = model.generate
else:
    import fcache
    gen = fcache.jit(model).generate
opts = dict(max_new_tokens=64, do_sample=False, use_cache=True, disable_compile=True,
            attention_mask=torch.ones_like(ids))
with torch.no_grad():
    gen(ids, **opts); gen(ids, **opts); torch.cuda.synchronize()
    t = time.perf_counter(); gen(ids, **opts); torch.cuda.synchronize(); wall = time.perf_counter() - t
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        gen(ids, **opts); torch.cuda.synchronize()
kern = collections.Counter(); count = collections.Counter()
for e in p.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        kern[e.name[:90]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        count[e.name[:90]] += 1
total = sum(kern.values())
print(f"== {system} batch {batch}: wall {wall*1e3:.1f} ms for 64 tokens ({wall/64*1e3:.3f} ms/token), "
      f"GPU kernel time {total/1e3:.1f} ms ({total/1e3/64:.3f} ms/token), launches {sum(count.values())} ({sum(count.values())/64:.0f}/token)")
for name, us in kern.most_common(14):
    print(f"  {us/1e3:8.2f} ms {count[name]:6d}x  {name}")
