"""CUDA graphs for the stitched program (Settings.cuda_graphs): steps replayed from CUDA
graphs give eager's loss and gradients, step after step, and torch's CUDA-graph trees
captured the graphs (no skip). Skipped without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fcache
from fcache import process
from fcache.examples.models import ModelConfig, build, sample_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_replayed_steps_match_eager(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    process.reset()
    counters.clear()
    cfg = ModelConfig(family="llama", layers=2, dim=64, heads=4, vocab=256, max_seq=64)
    model, reference = build(cfg).cuda(), build(cfg).cuda()
    tokens = sample_tokens(cfg, 2, 32).cuda()
    settings = fcache.Settings(cache_dir=tmp_path, progress=False, cuda_graphs=True)
    compiled = fcache.jit(model, settings=settings)
    expected = reference(tokens).float().square().mean()
    expected.backward()
    for _ in range(4):  # warm-up, capture, then replays
        model.zero_grad()
        loss = compiled(tokens).float().square().mean()
        loss.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-5)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert torch._inductor.cudagraph_trees.get_manager(0, create_if_none_exists=False)
