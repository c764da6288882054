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
    before = list(model.modules())
    keys = list(model.state_dict())
    assert fcache.jit(model, blocks=True) is model
    # Every module where it was, with its names: a checkpoint saved before loads after, and
    # an optimizer made before still updates the same parameters.
    assert list(model.modules()) == before and list(model.state_dict()) == keys
    compiled = {name for name, m in model.named_modules() if m._compiled_call_impl is not None}
    # The blocks, and the modules outside them that hold parameters, each alone.
    assert compiled == {"embed", "norm", "head", *(f"blocks.{i}" for i in range(3))}
    assert fcache.stats(model).regions == 0  # nothing compiled before the first call


def test_a_copy_of_a_compiled_model_runs_in_eager_on_its_own_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy
    import pickle

    monkeypatch.setenv("FCACHE_DIR", str(tmp_path / "fcache"))
    model = fcache.jit(_decoder(), blocks=True)
    twin = copy.deepcopy(model)  # an EMA of the weights, say
    assert all(m._compiled_call_impl is None for m in twin.modules())
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    cfg = models.ModelConfig(family="llama", layers=3, dim=32, heads=2, vocab=64, max_seq=16)
    tokens = models.sample_tokens(cfg, 2, 8)
    reference = _decoder()
    reference.load_state_dict(twin.state_dict())
    torch.testing.assert_close(twin(tokens), reference(tokens))
    again = pickle.loads(pickle.dumps(model))
    assert all(m._compiled_call_impl is None for m in again.modules())


def test_a_list_of_containers_is_not_blocks_and_a_module_holding_them_stays_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FCACHE_DIR", str(tmp_path / "fcache"))
    # `for attn, ff in self.layers`: the model iterates each inner list itself; the
    # outer list holds containers, each inner one two classes.
    pairs = torch.nn.ModuleList(
        torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)]) for _ in range(3)
    )
    with pytest.raises(FcacheError, match=r"no nn\.ModuleList"):
        repeated_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4)).append(pairs))

    class Encoder(torch.nn.Module):  # parameters of its own beside its layers
        def __init__(self) -> None:
            super().__init__()
            self.pos = torch.nn.Parameter(torch.zeros(4))
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.pos
            for layer in self.layers:
                x = layer(x)
            return x

    model = torch.nn.Sequential(Encoder(), torch.nn.Linear(4, 2))
    fcache.jit(model, blocks=True)
    compiled = {name for name, m in model.named_modules() if m._compiled_call_impl is not None}
    assert compiled == {"1", "0.layers.0", "0.layers.1", "0.layers.2"}  # not the encoder
