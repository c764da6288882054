"""Cold against warm processes' steady steps, one by one; at step CLOSE_AT the session's
compile pool is closed (its worker processes stop). Batch 2 x 2048.

    PYTHONPATH=. python cold2.py FAMILY LAYERS STEPS CLOSE_AT OUT.json
"""

import json
import os
import statistics
import subprocess
import sys
import time

import torch

from bench import hf


def apps() -> list[str]:
    """Processes holding a CUDA context, and their GPU memory."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        return [line for line in out.splitlines() if line.strip()]
    except Exception as exc:
        return [repr(exc)]


def kids() -> int:
    """Child processes of this one."""
    me, n = os.getpid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        n += int(stat.rsplit(")", 1)[1].split()[1]) == me
    return n


def main() -> None:
    family, layers, steps, close_at, out = sys.argv[1:6]
    torch.manual_seed(0)
    model = hf.build(family, int(layers), 1024, 16, 32000, 2048).to("cuda", torch.bfloat16)
    tokens = torch.randint(0, hf.vocab_size(model), (2, 2048), device="cuda")
    import fcache
    from fcache.config import Settings
    from fcache.engine.session import Session

    t0 = time.perf_counter()
    fn = fcache.jit(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        fn(tokens).logits.float().pow(2).mean().backward()

    step()
    torch.cuda.synchronize()
    info = {
        "first_s": round(time.perf_counter() - t0, 2), "apps_after_first": apps(),
        "kids_after_first": kids(), "compiles": fcache.stats(fn).compiles,
    }  # fmt: skip
    ms = []
    for i in range(int(steps)):
        if i == int(close_at):
            s = time.perf_counter()
            Session.get(Settings.from_env()).pool.close()
            info["close_s"] = round(time.perf_counter() - s, 3)
            time.sleep(2)
            info["apps_after_close"], info["kids_after_close"] = apps(), kids()
        s = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms.append(round((time.perf_counter() - s) * 1e3, 2))
    c = int(close_at)
    info["median_2_11"] = statistics.median(ms[:10])
    info["median_before_close"] = statistics.median(ms[1:c]) if c > 1 else None
    info["median_after_close"] = statistics.median(ms[c:]) if c < len(ms) else None
    info["ms"] = ms
    with open(out, "w") as f:
        json.dump(info, f)
    print(out, {k: v for k, v in info.items() if k != "ms"}, flush=True)


main()
