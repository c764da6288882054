"""One process of a plain torch.compile user who called `fcache.share_torch_compile()`:
a small training step, then a JSON report of Inductor's own counters.

    python -m tests.e2e.torch_share_run SERVER

The last line of stdout is the report: the first step's seconds, the output and a
gradient (to compare across processes), Inductor's counters (torch._dynamo.utils.counters
"inductor" and "aot_autograd"), its remote-cache stats per cache class
(torch._inductor.remote_cache.cache_stats), the Triton kernels it compiled, and the
sharing's own counters.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

import fcache


def _count_triton_compiles() -> list[str]:
    """Names of the Triton kernels compiled in this process (Inductor compiles in-process
    when TORCHINDUCTOR_COMPILE_THREADS=1)."""
    compiled: list[str] = []
    try:
        import triton
        import triton.compiler.compiler as compiler
    except ImportError:
        return compiled
    real = compiler.compile

    def counting(src: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(str(getattr(src, "name", src))[:80])
        return real(src, *args, **kwargs)

    compiler.compile = counting
    triton.compile = counting
    return compiled


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main() -> None:
    server = sys.argv[1]
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    triton_compiles = _count_triton_compiles()
    sharing = fcache.share_torch_compile(server)

    from torch._dynamo.utils import counters
    from torch._inductor import remote_cache

    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(64), Block(64)).to(device)
    x = torch.randn(4, 16, 64, device=device)
    compiled = torch.compile(model)
    start = time.perf_counter()
    out = compiled(x)
    out.square().mean().backward()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    first = time.perf_counter() - start
    expected = model(x)
    report = {
        "first_step_s": round(first, 3),
        "max_abs_error": float((out - expected).abs().max()),
        "output_sum": float(out.double().sum()),
        "grad_sum": float(model[0].up.weight.grad.double().sum()),
        "inductor": dict(counters["inductor"]),
        "aot_autograd": dict(counters["aot_autograd"]),
        "remote_cache": {
            name: {"hit": s.hit, "miss": s.miss, "put": s.put, "exception": s.exception}
            for name, s in remote_cache.cache_stats._stats.items()
        },
        "triton_compiles": triton_compiles,
        "fcache": {name: c.to_dict() for name, c in sharing.counters().items()},
        "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
