"""One rank of the distributed test job, as `torchrun --nproc-per-node 2` starts it:

    FCACHE_SERVER=unix:... FCACHE_SIGNING_KEY_FILE=... \\
        torchrun --standalone --nproc-per-node 2 -m tests.distributed.rank ROOT OUT

Joins the gloo process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...), then
trains, for two steps each, compiled through fcache and again without compiling, on the
same weights and this rank's own data:

- ddp: a Hugging Face Llama under DistributedDataParallel (1 MB buckets: DDP's graphs are
  cut in two), wrapped both ways, `DDP(fcache.jit(model))` and `fcache.jit(DDP(model))`;
- fsdp2: the Llama with each layer and the root `fully_shard`ed (FSDP2);
- simplefsdp: weights sharded and all-gathered inside the graphs (functional collectives,
  tests/distributed/models.py), so that fcache's graphs themselves hold collectives.

Every rank uses its own empty local cache, ROOT/rank<LOCAL_RANK>, and the server and the
one signing key the environment names (FCACHE_SERVER, FCACHE_SIGNING_KEY_FILE). Regions go
to the text executor (tests/text_executor.py). Writes OUT/rank<RANK>.json: per part, the
losses (compiled, eager), the largest gradient error, fcache's counters and the region keys.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fcache
from tests.distributed.models import Sharded, llama
from tests.text_executor import register

BUCKET_MB = 1  # DDP's smallest bucket (its first is 1 MB): the 1.9 MB Llama makes two
FLOOR = 1e-3  # gradient error floor, relative to the model's largest gradient norm
STEPS = 2


def _tokens(rank: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(10 + rank))


def _loss(output: Any) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return logits.float().pow(2).mean()


def _full(grad: torch.Tensor | None) -> torch.Tensor | None:
    """A gradient whole: an FSDP2 gradient is a DTensor shard (a collective on all ranks)."""
    if grad is None:
        return None
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def _train(
    compiled: Callable[..., Any],
    model: torch.nn.Module,
    eager: Callable[..., Any],
    reference: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """STEPS steps of the compiled and the eager job on the same weights (the steps update
    none): their losses and the largest gradient error, relative to each gradient's norm
    or the floor; a gradient eager has and fcache has not is an infinite error."""
    losses, error = [], 0.0
    for _ in range(STEPS):
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        got, expected = _loss(compiled(**inputs)), _loss(eager(**inputs))
        got.backward()
        expected.backward()
        losses.append([got.item(), expected.item()])
        pairs = [
            (_full(p.grad), _full(q.grad))
            for p, q in zip(model.parameters(), reference.parameters(), strict=True)
        ]
        pairs = [(p, q) for p, q in pairs if q is not None]
        floor = FLOOR * max(q.norm().item() for _, q in pairs)
        error = max(
            error,
            *(
                float("inf") if p is None else (p - q).norm().item() / max(q.norm().item(), floor)
                for p, q in pairs
            ),
        )
    return {"losses": losses, "grad_error": error}


def _counters(compiled: Any) -> dict[str, Any]:
    stats = fcache.stats(compiled)
    record = compiled._fcache_record  # the region keys, which stats only counts
    return {
        "graphs": stats.graphs,
        "regions": stats.regions,
        "unique_regions": stats.unique_regions,
        "compiles": stats.compiles,
        "fallbacks": stats.fallbacks,
        "hits": dict(stats.hits),
        "misses": dict(stats.misses),
        "errors": dict(stats.errors),
        "keys": sorted(record.keys),
    }


def ddp(settings: fcache.Settings, rank: int) -> dict[str, Any]:
    out = {}
    inputs = {"input_ids": _tokens(rank)}
    for order in ("ddp(jit)", "jit(ddp)"):
        model, reference = llama(), llama()
        if order == "ddp(jit)":
            inner = fcache.jit(model, settings=settings)
            compiled, counted = DDP(inner, bucket_cap_mb=BUCKET_MB), inner
        else:
            compiled = counted = fcache.jit(DDP(model, bucket_cap_mb=BUCKET_MB), settings=settings)
        eager = DDP(reference, bucket_cap_mb=BUCKET_MB)
        out[order] = {**_train(compiled, model, eager, reference, inputs), **_counters(counted)}
    return out


def fsdp2(settings: fcache.Settings, rank: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, reference = llama(), llama()
    for m in (model, reference):
        for layer in m.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
    compiled = fcache.jit(model, settings=settings)
    inputs = {"input_ids": _tokens(rank)}
    return {
        "fsdp2": {**_train(compiled, model, reference, reference, inputs), **_counters(compiled)}
    }


def simplefsdp(settings: fcache.Settings, rank: int) -> dict[str, Any]:
    model, reference = Sharded(), Sharded()
    compiled = fcache.jit(model, settings=settings)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(10 + rank))
    inputs = {"x": x}
    return {
        "simplefsdp": {
            **_train(compiled, model, reference, reference, inputs),
            **_counters(compiled),
        }
    }


def main(root: Path, out: Path) -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # two ranks on a two-core machine
    register()
    settings = fcache.Settings.from_env().replace(
        cache_dir=root / f"rank{local_rank}", executors=("text", "eager"), progress=False
    )
    start = time.perf_counter()
    parts: dict[str, Any] = {}
    for job in (ddp, fsdp2, simplefsdp):
        parts.update(job(settings, rank))
    report = {"rank": rank, "seconds": round(time.perf_counter() - start, 3), "parts": parts}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
