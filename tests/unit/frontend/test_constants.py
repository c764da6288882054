"""Tensor constants (fcache.frontend.constants, fcache.frontend.graph_text): small ones are
written as ops that regions compute, larger ones are stored with a program, and a model
that indexes with a Python list (Falcon's `fused_qkv[..., [-2], :]`) compiles with
Inductor, matches eager and is stored whole.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fcache.frontend import graph_text
from fcache.frontend.constants import SMALL, inline_small
from tests import fresh

ROOT = Path(__file__).resolve().parents[3]


def _constants(x: torch.Tensor) -> torch.Tensor:
    picked = x[..., torch.tensor([-2, 0]), :]  # an index list
    scaled = picked * torch.tensor([1.5, -0.0, float("nan"), 2.0])  # values that differ
    return scaled + torch.tensor(3) + torch.full((4,), 0.25)  # a scalar; a uniform one


def test_small_constants_become_ops_with_the_same_values() -> None:
    x = torch.randn(2, 5, 4)
    gm = make_fx(_constants)(x)
    assert sum(n.op == "get_attr" for n in gm.graph.nodes) == 3
    expected = gm(x)
    assert inline_small(gm) == 3
    assert not any(n.op == "get_attr" for n in gm.graph.nodes)
    # Dropped from the module too: AOTAutogradCache would serialize them (and fails to
    # with CUDA constants on torch 2.11).
    assert not [name for name, _ in gm.named_buffers()] and not hasattr(gm, "_tensor_constant0")
    got = gm(x)
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    # -0.0 stays -0.0: a column scaled by it keeps its sign bits.
    assert torch.equal(torch.signbit(got.nan_to_num()), torch.signbit(expected.nan_to_num()))
    # Every node a later stage reads has a value to read (partitioning, views).
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in calls)


def test_larger_constants_stay_and_are_stored_with_the_graph() -> None:
    table = torch.arange(SMALL + 1, dtype=torch.bfloat16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * table.clone() + torch.tensor([True, False] * 3, dtype=torch.bool).sum()

    x = torch.randn(SMALL + 1, dtype=torch.bfloat16)
    gm = make_fx(f)(x)
    assert inline_small(gm) == 1  # the bool vector; the table is larger than SMALL
    (kept,) = [n for n in gm.graph.nodes if n.op == "get_attr"]
    text = graph_text.dumps(gm)
    graph = graph_text.loads(text)
    loaded = torch.fx.GraphModule(graph_text.owner(graph), graph)
    assert torch.equal(loaded(x), gm(x))
    stored = getattr(loaded, kept.target)  # type: ignore[arg-type]
    assert stored.dtype == torch.bfloat16 and torch.equal(stored, table)
    graph_text.with_values(graph)
    assert graph_text.dumps(loaded) == text  # deterministic


_RUN = """
import json, sys
sys.path.insert(0, {root!r})
import torch, fcache
from tests.text_executor import register
register()

class Heads(torch.nn.Module):  # Falcon's multi-query split of a fused projection
    def __init__(self):
        super().__init__()
        self.fused = torch.nn.Linear(16, 48)
    def forward(self, x):
        fused = self.fused(x).view(2, 4, 6, 8)
        q, k, v = fused[..., :-2, :], fused[..., [-2], :], fused[..., [-1], :]
        return (torch.softmax(q * k, dim=-1) * v).sum()

torch.manual_seed(0)
model, reference = Heads(), Heads()
reference.load_state_dict(model.state_dict())
x = torch.randn(2, 4, 16)
settings = fcache.Settings.from_env().replace(progress=False, executors={executors!r})
compiled = fcache.jit(model, settings=settings)
compiled(x).backward()
reference(x).backward()
error = max((p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), reference.parameters()))
stats = fcache.stats(compiled)
print(json.dumps({{"error": error, "fallbacks": stats.fallbacks,
    "functions_loaded": stats.functions_loaded, "compiles": stats.compiles}}))
"""


def _run(tmp_path: Path, executors: tuple[str, ...]) -> dict[str, float]:
    inductor = tmp_path / f"inductor-{len(list(tmp_path.glob('inductor-*')))}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FCACHE_DIR": str(tmp_path / "fcache"),
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),  # fresh: only fcache's tiers are warm
    }
    # A file, not `-c`: a whole stored function is keyed by its source, which inspect
    # cannot read from a `-c` script.
    script = tmp_path / "heads.py"
    script.write_text(_RUN.format(root=str(ROOT), executors=executors))
    proc = fresh.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_list_indexing_compiles_with_inductor_and_matches_eager(tmp_path: Path) -> None:
    # Before: the index list was a region input; Inductor's CPU kernel of the backward's
    # index_put with the model's negative index corrupted the heap (or failed validation
    # on the zeros it was validated with) and the region ran in eager.
    report = _run(tmp_path, ("inductor", "eager"))
    assert report["error"] < 1e-5 and report["fallbacks"] == 0 and report["compiles"] > 0


def test_a_model_with_constants_is_stored_whole(tmp_path: Path) -> None:
    # Before: its graphs had no text form (get_attr), so a warm process traced it again.
    cold = _run(tmp_path, ("text", "eager"))
    assert cold["error"] < 1e-5 and cold["functions_loaded"] == 0
    warm = _run(tmp_path, ("text", "eager"))
    assert warm["error"] < 1e-5 and warm["functions_loaded"] == 1 and warm["compiles"] == 0
