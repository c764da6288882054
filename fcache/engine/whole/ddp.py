"""When the whole-function route steps aside for DistributedDataParallel.

torch.compile cuts a model that runs under DDP at DDP's gradient buckets (Dynamo's
`DDPOptimizer`, on while `torch._dynamo.config.optimize_ddp` is "ddp_optimizer", its
default): one graph per bucket, so that a bucket's all-reduce starts as soon as the
backward graph of its layers has run, while the backward of the layers before it goes on.
It does so where Dynamo converts a frame while a DDP module's forward is under way.
torch's precompile route (`aot_compile`, which fcache.engine.whole.route uses) does not:
a whole function traced under DDP is one graph, its backward one graph, and every
all-reduce waits for the whole backward (correct, but no communication overlaps compute).
So under DDP, fcache takes torch.compile's route (Dynamo, then fcache's backend per bucket
graph, each one's programs and regions stored as usual), as `torch.compile` does:

- `fcache.jit(model)` wrapped in DDP afterwards (`DDP(fcache.jit(model))`): `bucketed()`
  is true while DDP runs the model's forward;
- `fcache.jit(DDP(model))`: DDP's own forward cannot be traced whole (it leaves Dynamo for
  its bookkeeping), so no whole function is tried for it (`is_ddp`).
"""

from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel


def bucketed() -> bool:
    """Whether a graph traced now would be cut at DDP's buckets by torch.compile's route:
    a DDP module's forward is under way and Dynamo's DDP optimization is on."""
    if DistributedDataParallel._get_active_ddp_module() is None:
        return False
    from torch._dynamo.utils import get_optimize_ddp_mode

    return bool(get_optimize_ddp_mode() == "ddp_optimizer")


def is_ddp(model: object) -> bool:
    """Whether `model` is a DistributedDataParallel module (its forward is never whole)."""
    return isinstance(model, DistributedDataParallel)
