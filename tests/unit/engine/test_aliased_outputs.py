"""A model that returns a view of another of its outputs (`return y, y.view(-1, n)`): torch
2.13 rebuilds such an output with garbage sizes from a stored AOTAutograd entry (a warm
torch.compile process fails the same way), so fcache does not store its compiled function
or programs; a warm process traces it again and still compiles no region."""

from __future__ import annotations

from pathlib import Path

import torch

import fcache
from fcache import process


class Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.out = torch.nn.Linear(64, 101, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.out(torch.nn.functional.gelu(self.up(x)))
        return y, y.view(-1, 101)


def test_a_view_of_another_output_runs_in_a_warm_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, reference = Pair(), Pair()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 24, 32)
    settings = fcache.Settings(cache_dir=tmp_path, progress=False, executors=("eager",))
    for _ in range(2):  # compiled here; then as a warm process finds the cache
        torch._dynamo.reset()
        process.reset()
        compiled = fcache.jit(model, settings=settings)
        model.zero_grad()
        reference.zero_grad()
        got, expected = compiled(x), reference(x)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)
        assert got[1]._base is got[0] or got[1].data_ptr() == got[0].data_ptr()
        sum(o.square().mean() for o in got).backward()
        sum(o.square().mean() for o in expected).backward()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)
        stats = fcache.stats(compiled)
        assert stats.programs_loaded == 0 and stats.functions_loaded == 0  # never stored
    process.reset()
