"""The ops between regions on a GPU (fcache.engine.rewrite.stitch): a matmul with a misaligned
dimension runs padded (fcache.engine.rewrite.matmuls) and views run folded from the second call
(fcache.engine.rewrite.views), step after step with eager's loss and gradients; a product the
model returns as it is keeps its padded rows (no copy), as torch.compile's does. Skipped
without CUDA."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import fcache
from fcache import process

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


class Head(nn.Module):
    """A language model's output layer with GPT-2's trouble: 1001 classes, not a multiple
    of 8, so cuBLAS has no fast 16-bit kernel for it unpadded. How the logits leave it
    (`shape`) decides their layout: "transposed" and "viewed" are views of the product,
    which AOTAutograd rebuilds from a dense base; "returned" is the product itself, as
    Hugging Face's GPT-2 returns it (a bias-free linear layer on [batch, tokens, hidden]),
    which keeps the padded result's rows, 1008 apart, as torch.compile's does."""

    def __init__(self, shape: str) -> None:
        super().__init__()
        self.shape = shape
        self.norm = nn.LayerNorm(512)
        self.up = nn.Linear(512, 1024)
        self.out = nn.Linear(1024, 1001, bias=shape != "returned")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(self.norm(x)))
        if self.shape == "returned":
            return self.out(h.view(2, 512, 1024))
        logits = self.out(h).view(2, 512, 1001)
        return logits.transpose(0, 1) if self.shape == "transposed" else logits


STRIDES = {"transposed": (512 * 1001, 1), "viewed": (1001, 1), "returned": (1008, 1)}


@pytest.mark.parametrize("shape", sorted(STRIDES))
def test_misaligned_matmuls_run_padded_with_eagers_results(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, shape: str
) -> None:
    torch._dynamo.reset()
    process.reset()
    torch.manual_seed(0)
    model = Head(shape).cuda().bfloat16()
    reference = Head(shape).cuda().bfloat16()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    # Cut by op: the matmuls run between regions, where fcache pads them (a whole graph's
    # region holds them, and Inductor pads them itself).
    settings = fcache.Settings(
        cache_dir=tmp_path, progress=False, executors=("inductor", "eager"), regions="ops"
    )
    compiled = fcache.jit(model, settings=settings)
    with caplog.at_level(logging.DEBUG, logger="fcache.engine"):
        for _ in range(3):  # views as traced, then folded
            model.zero_grad()
            reference.zero_grad()
            logits = compiled(x)
            assert logits.stride()[-2:] == STRIDES[shape]
            got = logits.float().square().mean()
            expected = reference(x).float().square().mean()
            got.backward()
            expected.backward()
            torch.testing.assert_close(got, expected, rtol=2e-2, atol=0)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                assert p.grad is not None and q.grad is not None
                error = (p.grad.float() - q.grad.float()).norm() / q.grad.float().norm()
                assert error < 2e-2
    # forward, and both of the backward's matmuls of the output layer
    padded = sum(
        int(r.getMessage().split()[1]) for r in caplog.records if "padded" in r.getMessage()
    )
    assert padded >= 3
    assert "views folded" in caplog.text
