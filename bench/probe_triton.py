"""Probe (temporary): Inductor's Python-wrapper route on CUDA, compiled in one process,
loaded in a fresh one from the wrapper source + Triton bundle + best configs only."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REGIONS = [
    "lambda x, w: (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w,)",
    "lambda x, w: (torch.nn.functional.silu(x) * w,)",
    "lambda x, w: (torch.tanh(x) + w, x.sum(0))",
    "lambda x, w: (torch.softmax(x * w, dim=-1),)",
    "lambda x, w: (torch.exp(x) * w + 1,)",
]

COMPILE = r"""
import sys, os, time, json, glob, base64, torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch._inductor.compile_fx import compile_fx_inner
out = sys.argv[1]; fns = [eval(s) for s in json.loads(sys.argv[2])]
x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16); w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
ind = os.environ["TORCHINDUCTOR_CACHE_DIR"]
res = []
for i, f in enumerate(fns):
    from torch._inductor.decomposition import select_decomp_table
    gm = make_fx(f, decomposition_table=select_decomp_table())(x, w)
    before = set(glob.glob(ind + "/**/*.best_config", recursive=True))
    t = time.perf_counter()
    c = compile_fx_inner(gm, [x, w])
    ct = time.perf_counter() - t
    t = time.perf_counter()
    r = c.current_callable([x, w]); torch.cuda.synchronize()
    rt = time.perf_counter() - t
    ref = f(x, w)
    err = max(float((a.float() - b.float()).abs().max()) for a, b in zip(r, ref))
    best = sorted(set(glob.glob(ind + "/**/*.best_config", recursive=True)) - before)
    b = c._triton_bundle
    arts = [] if b is None else [
        {"hash": k.kernel_hash, "device": k.device,
         "files": {a.filename: base64.b64encode(a.payload).decode() for a in k.artifacts}}
        for k in b.kernel_artifacts]
    nstatic = 0 if b is None else len(b.static_autotuners or [])
    import pickle
    static = base64.b64encode(pickle.dumps(b.static_autotuners if b else [])).decode()
    res.append({"compile_s": ct, "first_run_s": rt, "err": err, "source": c.source_code,
                "kernels": arts, "n_static": nstatic, "static": static,
                "best": {os.path.relpath(p, ind): open(p).read() for p in best},
                "constants": repr(getattr(c, "constants", None))[:200]})
json.dump(res, open(out, "w"))
print(json.dumps([{k: v for k, v in r.items() if k not in ("source", "kernels", "best", "static")} | {"nkern": len(r["kernels"]), "nfiles": sum(len(k["files"]) for k in r["kernels"]), "bytes": sum(len(v) for k in r["kernels"] for v in k["files"].values()), "best": list(r["best"])} for r in res], indent=1))
print("A dirs", sorted(os.listdir(os.environ["TRITON_CACHE_DIR"])))
print("bundle", [[k["hash"] for k in r["kernels"]] for r in res])
open(os.environ["OUT"] + "/source0.py", "w").write(res[0]["source"])
"""

LOAD = r"""
import sys, os, time, json, base64, torch
t0 = time.perf_counter()
import triton
from triton.backends.nvidia import compiler as nvc
calls = {"make_cubin": 0, "make_ptx": 0, "bench": 0}
for name in ("make_cubin", "make_ptx"):
    orig = getattr(nvc.CUDABackend, name)
    def wrap(*a, _o=orig, _n=name, **k):
        calls[_n] += 1; return _o(*a, **k)
    setattr(nvc.CUDABackend, name, staticmethod(wrap) if isinstance(nvc.CUDABackend.__dict__[name], staticmethod) else wrap)
from torch._inductor.runtime import triton_heuristics as th
ob = th.CachingAutotuner.benchmark_all_configs
def bench(self, *a, **k):
    calls["bench"] += 1; return ob(self, *a, **k)
th.CachingAutotuner.benchmark_all_configs = bench
from torch._inductor.codecache import PyCodeCache
from torch._inductor import config
res = json.load(open(sys.argv[1])); fns = [eval(s) for s in json.loads(sys.argv[2])]
use_best = sys.argv[3] in ("1", "s"); use_static = sys.argv[3] == "s"
tri = os.environ["TRITON_CACHE_DIR"]; ind = os.environ["TORCHINDUCTOR_CACHE_DIR"]
x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16); w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t_import = time.perf_counter() - t0
mods, times = [], []
for r in res:
    t = time.perf_counter()
    for k in r["kernels"]:
        d = os.path.join(tri, k["hash"]); os.makedirs(d, exist_ok=True)
        for fn, p in k["files"].items():
            data = base64.b64decode(p)
            if fn.endswith(".json"): data = data.replace(b"[REPLACE]", d.encode())
            open(os.path.join(d, fn), "wb").write(data)
    if use_best:
        for rel, text in r["best"].items():
            p = os.path.join(ind, rel); os.makedirs(os.path.dirname(p), exist_ok=True); open(p, "w").write(text)
    if use_static:
        import pickle
        from torch._inductor.triton_bundler import TritonBundler
        print("static loaded", TritonBundler.load_autotuners(pickle.loads(base64.b64decode(r["static"]))))
    with config.patch(compile_threads=1):
        m = PyCodeCache.load(r["source"])
    t1 = time.perf_counter()
    out = m.call([x, w]); torch.cuda.synchronize()
    times.append((t1 - t, time.perf_counter() - t1)); mods.append(m)
errs = []
for m, f in zip(mods, fns):
    out = m.call([x, w]); ref = f(x, w)
    errs.append(max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref)))
xs = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16); ws = torch.randn(64, device="cuda", dtype=torch.bfloat16)
m = PyCodeCache.load(res[1]["source"].replace("4096", "8").replace("1024", "64")) if False else None
f = mods[4].call
for _ in range(20): f([x, w])
torch.cuda.synchronize(); t = time.perf_counter(); n = 300
for _ in range(n): f([x, w])
t_host = (time.perf_counter() - t) / n; torch.cuda.synchronize(); t_all = (time.perf_counter() - t) / n
print(json.dumps({"import_s": t_import, "load_and_first_call_s": times, "errs": errs, "calls": calls,
                  "host_us_per_call": t_host * 1e6, "wall_us_per_call": t_all * 1e6,
                  "tri_dirs": sorted(os.listdir(tri))}))
"""


def run(code, args, env):
    p = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    print(p.stdout[-20000:])
    if p.returncode:
        print(p.stderr[-5000:])


with tempfile.TemporaryDirectory() as tmp:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/a-ind", "TRITON_CACHE_DIR": f"{tmp}/a-tri"}
    run(COMPILE, [f"{tmp}/art.json", json.dumps(REGIONS)], env)
    print("A triton dirs:", len(os.listdir(f"{tmp}/a-tri")), "best files:", glob.glob(f"{tmp}/a-ind/**/*.best_config", recursive=True)[:3])
    for best in ("1", "s"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/b{best}-ind", "TRITON_CACHE_DIR": f"{tmp}/b{best}-tri"}
        print("LOAD use_best =", best)
        run(LOAD, [f"{tmp}/art.json", json.dumps(REGIONS), best], env)
