"""Who builds Triton kernels in a warm fcache process: each triton.compile call's kernel
and the fcache/torch frames that asked for it, and a cProfile of the first step only."""
import cProfile, collections, io, json, pstats, sys, time, traceback
import torch, triton.compiler.compiler as tc
sys.path.insert(0, ".")
from bench import hf
import fcache

family = sys.argv[1]
compiles = []
original = tc.compile
def compile(src, *a, **k):
    start = time.perf_counter()
    out = original(src, *a, **k)
    stack = [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[-14:-1]]
    compiles.append({"name": getattr(getattr(src, "fn", None), "__name__", str(src)[:60]),
                     "s": round(time.perf_counter() - start, 4), "stack": stack})
    return out
tc.compile = compile
import triton; triton.compile = compile
model = hf.build(family, 4, 512, 8, 32000, 1024).to("cuda", torch.bfloat16)
tokens = torch.randint(0, 32000, (2, 1024), device="cuda")
system = sys.argv[2] if len(sys.argv) > 2 else "fcache"
compiled = fcache.jit(model) if system == "fcache" else torch.compile(model)
profile = cProfile.Profile()
start = time.perf_counter()
profile.enable()
out = compiled(tokens)
logits = out.logits if hasattr(out, "logits") else out
logits.float().pow(2).mean().backward()
torch.cuda.synchronize()
profile.disable()
first = time.perf_counter() - start
stats = fcache.stats(compiled) if system == "fcache" else None
print(json.dumps({"family": family, "system": system, "first_step_s": round(first, 3),
                  "functions_loaded": stats and stats.functions_loaded,
                  "compiles": stats and stats.compiles, "load_seconds": stats and round(stats.load_seconds, 3),
                  "triton_compiles": len(compiles), "triton_s": round(sum(c["s"] for c in compiles), 3)}))
for c in compiles[:6]:
    print("triton.compile", c["name"], c["s"], "\n   " + "\n   ".join(c["stack"]))
print(collections.Counter(c["name"] for c in compiles).most_common(10))
text = io.StringIO()
s = pstats.Stats(profile, stream=text)
s.sort_stats("cumulative").print_stats(45)
s.sort_stats("tottime").print_stats(20)
print(text.getvalue().replace("/opt/torch/.venv/lib/python3.12/site-packages/", ""))
