"""fcache: compile each fused region of a PyTorch model once, per node, per cluster.

    import fcache
    model = fcache.jit(model)          # forward and backward compiled, region by region
    loss = model(x).sum(); loss.backward()
    print(fcache.stats(model))         # regions, unique regions, hits per tier, compiles

`torch.compile(model, backend="fcache")` works too (settings from FCACHE_* variables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from fcache.config import Settings
from fcache.errors import (
    CompileError,
    ConfigError,
    CorruptArtifact,
    FcacheError,
    StoreUnavailable,
    UnsupportedRegion,
)
from fcache.stats import ModelStats

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "CompileError",
    "ConfigError",
    "CorruptArtifact",
    "FcacheError",
    "ModelStats",
    "Settings",
    "StoreUnavailable",
    "UnsupportedRegion",
    "jit",
    "stats",
]
__version__ = "0.1.0"

M = TypeVar("M")
_RECORD = "_fcache_record"


def jit(
    model: M,
    *,
    settings: Settings | None = None,
    server: str | None = None,
    executors: Sequence[str] | None = None,
    dynamic: bool = False,
    fullgraph: bool = False,
) -> M:
    """Compile `model` (an nn.Module or a function) through fcache; returns the compiled one.

    Compilation happens on the first call, per input signature, as with torch.compile.
    `settings` defaults to `Settings.from_env()`; `server` and `executors` override it.
    `dynamic=False` compiles each input shape separately (static shapes make the best
    kernels and the most reusable keys).
    """
    import torch

    from fcache.frontend.capture import make_backend
    from fcache.pipeline import ModelRecord, Session

    settings = settings if settings is not None else Settings.from_env()
    if server is not None:
        settings = settings.replace(server=server)
    if executors is not None:
        settings = settings.replace(executors=tuple(executors))
    session = Session.get(settings)
    record = ModelRecord()

    def compile_graph(gm: Any, inputs: Any, label: str) -> Any:
        return session.compile_graph(gm, inputs, label, record=record)

    compiled = torch.compile(
        model, backend=make_backend(compile_graph), dynamic=dynamic, fullgraph=fullgraph
    )
    setattr(compiled, _RECORD, record)
    return compiled  # type: ignore[return-value]


def stats(model: object) -> ModelStats:
    """What compiling `model` (returned by `fcache.jit`) has cost in this process so far."""
    record = getattr(model, _RECORD, None)
    if record is None:
        raise FcacheError(f"{type(model).__name__} was not compiled by fcache.jit")
    return record.snapshot()
