"""Why fcache's cold process decodes slower with CUDA graphs (issue #43), batch 8, static cache,
256 new tokens. Per generate call: wall, CUDA-graph tree work, roots, the static cache's address
(new or seen), memory allocated/reserved, threads alive. Then one call sampled (what the other
threads do) and one call profiled (host ops, GPU kernel time). argv: system [gc]."""
import argparse, collections, gc, logging, os, sys, threading, time
sys.path.insert(0, ".")
import torch
from torch._inductor import cudagraph_trees as ct
from bench import generate as g

if os.environ.get("DIAG_DEBUG"):
    h = logging.StreamHandler(sys.stdout); h.setLevel(logging.DEBUG)
    for name in ("fcache.engine.compile.workers", "fcache.engine.compile.session"):
        lg = logging.getLogger(name); lg.setLevel(logging.DEBUG); lg.addHandler(h)
counts = collections.Counter()
for name in ("record_function", "execute_node", "run_eager"):
    orig = getattr(ct.CUDAGraphTreeManager, name)
    def wrap(self, *a, _orig=orig, _name=name, **k):
        counts[_name] += 1
        return _orig(self, *a, **k)
    setattr(ct.CUDAGraphTreeManager, name, wrap)
system = sys.argv[1]
collect = "gc" in sys.argv[2:]
N = 256
args = argparse.Namespace(family="hf-llama", layers=4, dim=1024, heads=16, vocab=32000, prompt=128,
                          new_tokens=N, device="cuda", dtype="bfloat16")
model, ids = g.build(args, 8)
opts = dict(max_new_tokens=N, do_sample=False, use_cache=True, disable_compile=True,
            attention_mask=torch.ones_like(ids), cache_implementation="static",
            return_dict_in_generate=True)
if system == "ro":
    opts["disable_compile"] = False; gen = model.generate
else:
    import fcache
    gen = fcache.jit(model).generate
seen = []
MB = 1 << 20
def one(call):
    if collect:
        print(f"  gc.collect() -> {gc.collect()} objects", flush=True)
    before = dict(counts)
    t = time.perf_counter(); out = gen(ids, **opts); torch.cuda.synchronize(); wall = time.perf_counter() - t
    try:
        p = out.past_key_values.layers[0].keys.data_ptr()
    except Exception as exc:
        p = repr(exc)[:60]
    del out
    diff = {k: counts[k] - before.get(k, 0) for k in counts}
    m = ct.get_manager(0, create_if_none_exists=False)
    roots = sum(len(v) for v in m.roots.values()) if m else None
    state = "new" if p not in seen else f"as call {seen.index(p)}"
    seen.append(p)
    threads = sorted(t.name for t in threading.enumerate())
    print(f"{system} call {call}: {wall:.3f} s, {diff}, roots {roots}, cache keys {p if isinstance(p, str) else hex(p)} ({state}), "
          f"alloc {torch.cuda.memory_allocated() / MB:.0f} MB, reserved {torch.cuda.memory_reserved() / MB:.0f} MB, "
          f"threads {len(threads)}: {collections.Counter(threads)}", flush=True)

with torch.no_grad():
    for call in range(5):
        one(call)
    # what the other threads do during a call
    samples = collections.Counter(); stop = threading.Event(); main = threading.main_thread().ident
    names = {}
    def sample():
        while not stop.is_set():
            for tid, frame in sys._current_frames().items():
                if tid == main or tid == threading.get_ident():
                    continue
                f = frame; stack = []
                while f is not None and len(stack) < 3:
                    stack.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}:{f.f_lineno}")
                    f = f.f_back
                samples[(names.get(tid) or next((t.name for t in threading.enumerate() if t.ident == tid), "?"), " < ".join(stack))] += 1
            time.sleep(0.002)
    s = threading.Thread(target=sample, name="diag-sampler", daemon=True); s.start()
    one("5 (sampled)")
    stop.set(); s.join()
    for (name, stack), n in samples.most_common(12):
        print(f"  sample {n:5d} {name}: {stack}")
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        one("6 (profiled)")
    ka = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    print(f"  profiled: GPU kernel time {gpu:.1f} ms a call")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
