"""A process's steps from its start, timed one by one, with what else ran meanwhile:
the collector's passes, the allocator's trips to the driver, CPU time per thread of this
process and of its child processes (compile workers).

    PYTHONPATH=. python steps.py SYSTEM FAMILY LAYERS STEPS OUT.json   # SYSTEM: fcache or tc
"""

import gc
import json
import os
import sys
import time

import torch

from bench import hf

TICK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _cpu(stat: str) -> float:
    f = stat.rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def threads() -> dict[str, float]:
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = _read(f"/proc/self/task/{tid}/comm").strip()
            out[f"{name}:{tid}"] = _cpu(_read(f"/proc/self/task/{tid}/stat"))
        except OSError:
            pass
    return out


def children() -> dict[str, float]:
    me, out, parents = os.getpid(), {}, {os.getpid()}
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            s = _read(f"/proc/{pid}/stat")
        except OSError:
            continue
        stats[int(pid)] = s
    changed = True
    while changed:
        changed = False
        for pid, s in stats.items():
            ppid = int(s.rsplit(")", 1)[1].split()[1])
            if ppid in parents and pid not in parents:
                parents.add(pid)
                changed = True
    for pid in parents - {me}:
        out[str(pid)] = _cpu(stats[pid])
    return out


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    d = {k: round(v - a.get(k, 0.0), 3) for k, v in b.items()}
    return {k: v for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0.005}


def main() -> None:
    system, family, layers, steps, out = sys.argv[1:6]
    torch.manual_seed(0)
    model = hf.build(family, int(layers), 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
    tokens = torch.randint(0, hf.vocab_size(model), (2, 2048), device="cuda")
    t0 = time.perf_counter()
    if system == "tc":
        fn = torch.compile(model)
    else:
        import fcache

        fn = fcache.jit(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        o = fn(tokens)
        logits = o.logits if hasattr(o, "logits") else o[0]
        logits.float().pow(2).mean().backward()

    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    gc_s = [0.0]
    mark = [0.0]

    def collector(phase: str, info: dict) -> None:
        if phase == "start":
            mark[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - mark[0]

    gc.callbacks.append(collector)
    rows = []
    th, ch = threads(), children()
    windows = []
    for i in range(int(steps)):
        m0 = torch.cuda.memory_stats()
        g0 = gc_s[0]
        s = time.perf_counter()
        step()
        host = time.perf_counter() - s
        torch.cuda.synchronize()
        wall = time.perf_counter() - s
        m1 = torch.cuda.memory_stats()
        rows.append({
            "i": i + 2,
            "ms": round(wall * 1e3, 2),
            "host_ms": round(host * 1e3, 2),
            "gc_ms": round((gc_s[0] - g0) * 1e3, 2),
            "mallocs": m1.get("num_device_alloc", 0) - m0.get("num_device_alloc", 0),
            "frees": m1.get("num_device_free", 0) - m0.get("num_device_free", 0),
        })  # fmt: skip
        if (i + 1) % 10 == 0:
            th2, ch2 = threads(), children()
            windows.append({"after": i + 2, "threads": delta(th, th2), "children": delta(ch, ch2)})
            th, ch = th2, ch2
    times = {}
    try:
        from torch._dynamo.utils import compile_times

        times = compile_times(repr="csv", aggregate=True)
    except Exception as exc:
        times = repr(exc)
    result = {
        "system": system, "family": family, "layers": int(layers), "first_s": round(first, 2),
        "rows": rows, "windows": windows, "compile_times": times,
        "reserved_gb": round(torch.cuda.memory_reserved() / 2**30, 2),
        "segments": torch.cuda.memory_stats().get("segment.all.current"),
    }  # fmt: skip
    with open(out, "w") as f:
        json.dump(result, f, indent=0, default=str)
    ms = [r["ms"] for r in rows]
    print(
        system,
        family,
        layers,
        "first",
        round(first, 2),
        "steps ms",
        ms[:12],
        "...",
        "median 2-11",
        sorted(ms[:10])[5],
        "median last 20",
        sorted(ms[-20:])[10],
        flush=True,
    )


if __name__ == "__main__":
    main()
