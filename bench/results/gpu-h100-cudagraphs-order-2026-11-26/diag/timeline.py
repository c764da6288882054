"""Cold-start timeline of one fcache process: wall start/end and thread CPU time of the
pieces of a cold start, per thread: fcache's (regions built, loaded, validated, stored;
whole functions compiled and serialized) and torch's (AOTAutograd's stages, the min-cut
partitioner); torch's own `compile_times` table is printed to stderr at exit.

    PYTHONPATH=. python timeline.py OUT.json -- <bench.step_profile arguments>
"""
# ruff: noqa: E402  (the clock starts before the imports it times)

import functools
import json
import sys
import threading
import time

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
                events.append(
                    (
                        label,
                        threading.current_thread().name,
                        round(s - T0, 3),
                        round(time.perf_counter() - T0, 3),
                        round(time.thread_time() - c, 3),
                        info,
                    )
                )

    setattr(owner, name, wrapped)


import torch._dynamo.convert_frame as CF

import fcache.cache.tiered as TC
import fcache.engine.session as S
import fcache.engine.workers as W
import fcache.executors.inductor as I

trace(CF, "_compile", label="dynamo")
trace(S, "partition")
trace(
    S.Session,
    "_build",
    extra=lambda a, out: (
        f"{len(a[1].canon.nodes)} nodes, compile {out[1].compile_seconds:.2f}s" if out else ""
    ),
)
trace(S.Session, "compile_graph")
trace(S.Session, "_fetch_or_compile")
trace(S, "validate")
trace(TC.TieredCache, "put")
trace(W.CompilePool, "prestart")
for cls in vars(I).values():
    if isinstance(cls, type) and hasattr(cls, "load") and cls.__module__ == I.__name__:
        trace(cls, "load")
        trace(cls, "compile")
import torch._functorch._aot_autograd.graph_compile as GC

for n in ("_aot_stage2b_fw_compile", "_aot_stage2b_bw_compile"):
    if hasattr(GC, n):
        trace(GC, n)
import torch._dynamo.aot_compile as AC

import fcache.engine.whole as WH

trace(WH.Whole, "_compile")
trace(WH.Whole, "_load")
trace(AC.AOTCompiledFunction, "serialize")
import torch._functorch.partitioners as PA

trace(PA, "min_cut_rematerialization_partition")
import torch._functorch.aot_autograd as AA

for n in ("aot_stage1_graph_capture", "aot_stage2_compile", "create_aot_state"):
    for mod in (AA, GC):
        if hasattr(mod, n):
            trace(mod, n)
import torch._dynamo.output_graph as OG

trace(OG.OutputGraph, "call_user_compiler")
trace(OG.OutputGraph, "compile_and_call_fx_graph")
out = sys.argv[1]
sys.argv = ["step_profile", *sys.argv[3:]]
import atexit

from bench import step_profile


def dump():
    with open(out, "w") as f:
        json.dump(sorted(events, key=lambda e: e[2]), f, indent=0)


def dump2():
    dump()
    try:
        from torch._dynamo.utils import compile_times

        print(compile_times(repr="str", aggregate=True), file=sys.stderr)
    except Exception as exc:
        print("compile_times:", exc, file=sys.stderr)


atexit.register(dump2)
s = time.perf_counter()
step_profile.main()
