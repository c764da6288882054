"""Capturing real aten graphs for tests, through fcache's own capture backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from fcache.frontend.capture import make_backend


def capture(fn: Callable[..., Any], *args: Any, backward: bool = True) -> list[fx.GraphModule]:
    """The aten graphs fcache's backend receives for fn(*args) (forward, then backward)."""
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, inputs: Any, label: str) -> Any:
        graphs.append(gm)
        forward = gm.forward

        def run(args: list[Any]) -> Any:
            return forward(*args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=make_backend(record), dynamic=False)
    out = compiled(*args)
    if backward:
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return graphs
