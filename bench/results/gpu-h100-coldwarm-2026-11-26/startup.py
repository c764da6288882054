"""A compile worker's start-up, alone and eight at once (as CompilePool.prestart starts them):
which step slows down when eight processes start together? Each process has caches of its
own and two Inductor compile threads, as a worker on a 16-core host with 8 workers has.
Each row is a whole process, from its start to its exit (exit included).

    PYTHONPATH=. python startup.py
"""

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time

CUDA = "import torch; torch.zeros(1, device='cuda')"
STEPS = {
    "python": "pass",
    "import torch": "import torch",
    "+ CUDA context": CUDA,
    "+ Inductor import": CUDA + "; import torch._inductor.compile_fx",
    "+ probe compile (warm-up)": (
        "import torch; from fcache.executors import registry; "
        "from fcache.engine.workers import _warm_up; "
        "_warm_up(registry.create('inductor'), torch.device('cuda'))"
    ),
}


def run(code: str) -> float:
    caches = tempfile.mkdtemp()
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=caches + "/ind",
        TRITON_CACHE_DIR=caches + "/tri",
        TORCHINDUCTOR_COMPILE_THREADS="2",
    )
    start = time.perf_counter()
    quiet = subprocess.DEVNULL
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stdout=quiet, stderr=quiet)
    return time.perf_counter() - start


for name, code in STEPS.items():
    alone = min(run(code) for _ in range(2))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        eight = sorted(pool.map(run, [code] * 8))
    print(
        f"{name:28s} alone {alone:5.2f} s   "
        f"eight at once: median {eight[4]:5.2f}, slowest {eight[-1]:5.2f} s",
        flush=True,
    )
