"""Cold-start timeline of one fcache process: wall start/end and thread CPU time of the
pieces of a cold start, per thread. Usage: python .gpu/timeline.py OUT.json -- <step_profile args>"""
import functools, json, sys, threading, time
T0 = time.perf_counter()
events = []
lock = threading.Lock()

def trace(owner, name, label=None, extra=None):
    fn = getattr(owner, name, None)
    if fn is None:
        print("timeline: no", owner, name, file=sys.stderr)
        return
    label = label or f"{getattr(owner, '__name__', owner)}.{name}"
    @functools.wraps(fn)
    def wrapped(*a, **k):
        s, c = time.perf_counter(), time.thread_time()
        out = None
        try:
            out = fn(*a, **k)
            return out
        finally:
            info = ""
            if extra is not None:
                try:
                    info = extra(a, out)
                except Exception as exc:
                    info = repr(exc)
            with lock:
                events.append((label, threading.current_thread().name, round(s - T0, 3),
                               round(time.perf_counter() - T0, 3), round(time.thread_time() - c, 3), info))
    setattr(owner, name, wrapped)

import fcache.engine.session as S, fcache.engine.workers as W, fcache.cache.tiered as TC
import fcache.executors.inductor as I, fcache.engine.program as P, fcache.engine.whole as WH
import fcache.engine.backend as B
import torch._dynamo.convert_frame as CF
trace(CF, "_compile", label="dynamo")
trace(S, "partition")
trace(S.Session, "_build", extra=lambda a, out: f"{len(a[1].canon.nodes)} nodes, compile {out[1].compile_seconds:.2f}s" if out else ""); trace(S.Session, "compile_graph"); trace(S.Session, "_fetch_or_compile")
trace(S, "validate"); trace(TC.TieredCache, "put"); trace(W.CompilePool, "prestart")
for cls in vars(I).values():
    if isinstance(cls, type) and hasattr(cls, "load") and cls.__module__ == I.__name__:
        trace(cls, "load"); trace(cls, "compile")
import torch._functorch._aot_autograd.graph_compile as GC
for n in ("_aot_stage2b_fw_compile", "_aot_stage2b_bw_compile"):
    if hasattr(GC, n): trace(GC, n)

import torch._dynamo.convert_frame as CF2, torch._dynamo.package as PK
trace(CF2, "fullgraph_capture"); trace(CF2.GraphCaptureOutput, "build_guards")
try:
    import torch._dynamo.aot_compile as AC
    trace(AC, "aot_compile_fullgraph")
except Exception as exc: print("timeline:", exc, file=sys.stderr)
trace(WH.Whole, "_compile"); trace(B.Backend, "__call__", label="backend")
for n in ("aot_stage1_graph_capture", "_aot_stage2a_partition", "_cache_autograd_info"):
    if hasattr(GC, n): trace(GC, n)
import fcache.frontend.causal as CA
trace(B, "restore_is_causal") if hasattr(B, "restore_is_causal") else trace(CA, "restore_is_causal")
out = sys.argv[1]
sys.argv = ["step_profile"] + sys.argv[3:]
from bench import step_profile
import atexit
def dump():
    with open(out, "w") as f:
        json.dump(sorted(events, key=lambda e: e[2]), f, indent=0)
atexit.register(dump)
s = time.perf_counter()
step_profile.main()
