"""Canonical regions of what torch.compile captures, for tests (no executor involved)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.frontend.canonicalize import CanonicalRegion, canonicalize
from fcache.frontend.capture import make_backend
from fcache.frontend.partition import partition


def capture_regions(fn: Callable[[Any], object], target: object) -> list[CanonicalRegion]:
    """Every distinct canonical region of the aten graphs captured while fn(compiled target)
    runs (forward and backward), in first-seen order. The graphs themselves run in eager."""
    found: dict[bytes, CanonicalRegion] = {}

    def compile_graph(gm: torch.fx.GraphModule, inputs: Any, label: str) -> Any:
        for region in partition(gm.graph).regions:
            canon = canonicalize(region)
            found.setdefault(canon.text, canon)
        forward = gm.forward

        def run(args: list[Any]) -> Any:
            return forward(*args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    torch._dynamo.reset()
    try:
        fn(torch.compile(target, backend=make_backend(compile_graph)))
    finally:
        torch._dynamo.reset()
    return list(found.values())


@functools.cache
def model_regions(family: str, dtype: torch.dtype) -> tuple[CanonicalRegion, ...]:
    """The regions of one training step of a small example model, on CPU."""
    cfg = ModelConfig(family=family, layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    model = build(cfg).to(dtype)
    tokens = sample_tokens(cfg, 2, 8)
    return tuple(capture_regions(lambda compiled: compiled(tokens).float().sum().backward(), model))
