"""fcache: compile each fused region of a PyTorch model once, per node, per cluster.

    import fcache
    model = fcache.jit(model)          # forward and backward compiled, region by region
    loss = model(x).sum(); loss.backward()
    print(fcache.stats(model))         # regions, unique regions, hits per tier, compiles

`torch.compile(model, backend="fcache")` works too (settings from FCACHE_* variables), and
`fcache.share_torch_compile()` makes plain torch.compile share Inductor's own caches
through fcache-server.
"""

from __future__ import annotations

from fcache.api import jit, stats
from fcache.config import Settings
from fcache.errors import (
    CompileError,
    ConfigError,
    CorruptArtifact,
    FcacheError,
    StoreUnavailable,
    UnsupportedRegion,
)
from fcache.share import share_torch_compile
from fcache.stats import ModelStats
from fcache.version import __version__

__all__ = [
    "CompileError",
    "ConfigError",
    "CorruptArtifact",
    "FcacheError",
    "ModelStats",
    "Settings",
    "StoreUnavailable",
    "UnsupportedRegion",
    "__version__",
    "jit",
    "share_torch_compile",
    "stats",
]
