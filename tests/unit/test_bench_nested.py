"""bench's torch.compile-nested system: each repeated block's forward marked as a nested
compile region on the instance, the class left as it was, the model's results unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.measure import _blocks, _mark_nested
from fcache.examples.models import ModelConfig, build, sample_tokens


def test_blocks_are_marked_per_instance_and_compute_as_before() -> None:
    cfg = ModelConfig(family="llama", layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    model = build(cfg)
    reference = copy.deepcopy(model)
    cls = type(model.blocks[0])
    plain_forward = cls.forward
    _mark_nested(_blocks(model))

    assert cls.forward is plain_forward  # other models of the class are not touched
    marked = [block.forward.__func__ for block in model.blocks]
    assert all(fn is marked[0] for fn in marked)  # one function: Dynamo reuses by it
    assert marked[0].__marked_compile_region_fn__ is plain_forward
    assert all(block.forward.__self__ is block for block in model.blocks)

    tokens = sample_tokens(cfg, batch=2, seq=16)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    compiled(tokens).float().square().mean().backward()
    reference(tokens).float().square().mean().backward()
    pairs = zip(model.named_parameters(), reference.named_parameters(), strict=True)
    for (name, got), (_, want) in pairs:
        assert got.grad is not None, name
        torch.testing.assert_close(got.grad, want.grad, msg=name)


def test_blocks_of_two_classes_are_refused() -> None:
    blocks = [torch.nn.Linear(2, 2), torch.nn.ReLU()]
    with pytest.raises(ValueError, match="two classes"):
        _mark_nested(blocks)
