"""Which modules `fcache.jit(model, blocks=True)` compiles (fcache.engine.blocks), and the
errors it gives before touching a cache directory. That the blocks are traced once and
match eager: tests/unit/engine/test_whole.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fcache
from fcache.engine.blocks import repeated_blocks
from fcache.errors import ConfigError, FcacheError
from fcache.examples import models


def _decoder() -> torch.nn.Module:
    cfg = models.ModelConfig(family="llama", layers=3, dim=32, heads=2, vocab=64, max_seq=16)
    return models.build(cfg)


def test_the_blocks_are_the_largest_list_of_one_class() -> None:
    model = _decoder()
    assert repeated_blocks(model) is model.blocks  # type: ignore[attr-defined]
    # A smaller list of one class, and a larger one of mixed classes, do not win.
    model.heads = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(3))  # type: ignore[assignment]
    model.mixed = torch.nn.ModuleList([torch.nn.Linear(64, 64), torch.nn.Conv1d(64, 64, 9)])  # type: ignore[assignment]
    assert repeated_blocks(model) is model.blocks  # type: ignore[attr-defined]


def test_a_model_without_blocks_is_told_so_before_any_cache_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FCACHE_DIR", str(tmp_path / "fcache"))
    with pytest.raises(FcacheError, match=r"no nn\.ModuleList"):
        fcache.jit(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), blocks=True)
    with pytest.raises(FcacheError, match=r"no nn\.ModuleList"):  # one block repeats nothing
        fcache.jit(torch.nn.ModuleList([torch.nn.Linear(4, 4)]), blocks=True)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        fcache.jit(torch.sin, blocks=True)
    assert not (tmp_path / "fcache").exists()


def test_blocks_with_cuda_graphs_is_a_setting_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FCACHE_DIR", str(tmp_path / "fcache"))
    monkeypatch.setenv("FCACHE_CUDA_GRAPHS", "1")
    with pytest.raises(ConfigError, match="FCACHE_CUDA_GRAPHS"):
        fcache.jit(_decoder(), blocks=True)


def test_the_blocks_are_compiled_in_place_and_the_model_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FCACHE_DIR", str(tmp_path / "fcache"))
    model = _decoder()
    before = list(model.blocks)  # type: ignore[attr-defined]
    parameters = [id(p) for p in model.parameters()]
    assert fcache.jit(model, blocks=True) is model
    after = list(model.blocks)  # type: ignore[attr-defined]
    assert all(a is not b and a._orig_mod is b for a, b in zip(after, before, strict=True))
    # The modules outside the blocks that hold parameters are compiled too, each alone.
    for name in ("embed", "norm", "head"):
        assert isinstance(getattr(model, name), torch._dynamo.eval_frame.OptimizedModule), name
    # The parameters stay the model's own (an optimizer made before still updates them).
    assert [id(p) for p in model.parameters()] == parameters
    assert fcache.stats(model).regions == 0  # nothing compiled before the first call
