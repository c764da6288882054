"""Dynamic shapes (fcache.engine.dynamic, fcache.engine.whole.route): a model trained at
many sequence lengths compiles one dynamic graph after the second length, matches eager at
every length (a length the dynamic graph's guards exclude included), and a fresh process
with fcache's cache (and an empty Inductor cache) compiles nothing at lengths never seen.

Real compiles: the static regions with the text executor (tests/text_executor.py, no C++
compiler), the dynamic graph with Inductor's CPU backend, in fresh processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fresh import run_json

_RUN = """
import json, os, sys, time
import torch
import fcache
from torch._dynamo.utils import counters
from tests.text_executor import register
from bench import hf

register()
torch.manual_seed(0)
model = hf.build("hf-llama", 1, 32, 4, 128, 64)
reference = hf.build("hf-llama", 1, 32, 4, 128, 64)
reference.load_state_dict(model.state_dict())
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(model, settings=settings)
rows = []
for length in {lengths!r}:
    tokens = torch.randint(0, 128, (2, length), generator=torch.Generator().manual_seed(length))
    loss = compiled(tokens).logits.float().square().mean()  # labels: NaN at length 1
    loss.backward()
    expected = reference(tokens).logits.float().square().mean()
    expected.backward()
    error = max((p.grad - q.grad).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters()))
    model.zero_grad(); reference.zero_grad()
    stats = fcache.stats(compiled)
    rows.append({{
        "length": length, "loss": loss.item(), "expected": expected.item(),
        "grad_error": error, "compiles": stats.compiles,
        "dynamic_compiled": stats.dynamic_compiled, "dynamic_loaded": stats.dynamic_loaded,
        "functions_loaded": stats.functions_loaded,
    }})
print(json.dumps({{
    "rows": rows, "inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"]),
}}))
"""


def _run(tmp_path: Path, lengths: list[int], name: str) -> dict:
    report = run_json(
        _RUN.format(lengths=lengths),
        FCACHE_DIR=str(tmp_path / "fcache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{name}"),  # empty: fcache's only
        FCACHE_WHOLE="1",
    )
    for row in report["rows"]:  # eager's loss and gradients at every length
        assert row["loss"] == pytest.approx(row["expected"], rel=1e-4), row
        assert row["grad_error"] < 1e-4, row
    return report


def test_one_dynamic_compile_serves_every_length_and_a_warm_process_compiles_nothing(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    cold = _run(tmp_path, [16, 8, 16, 12, 24, 5, 1], "cold")
    rows: dict[int, dict] = {}
    for row in cold["rows"]:
        rows.setdefault(row["length"], row)  # 16's first step
    # 16: static regions. 8: the length went dynamic, one Dynamo graph compiled by Inductor.
    assert rows[16]["compiles"] > 0 and rows[16]["dynamic_compiled"] == 0
    assert rows[8]["dynamic_compiled"] == 1
    # Then nothing grows: 16 runs its static function, 12, 24, 5 the dynamic one.
    for length in (12, 24, 5):
        assert rows[length]["compiles"] == rows[16]["compiles"]
        assert rows[length]["dynamic_compiled"] == 1
    # 1: excluded by the dynamic function's guards (torch specializes a size of 1): traced
    # and compiled again, statically, and eager's results (checked above).
    assert rows[1]["dynamic_compiled"] == 1 and rows[1]["compiles"] > rows[16]["compiles"]

    # `fcache stats` shows the dynamic graph (the session's counters, flushed at exit).
    env = {**os.environ, "FCACHE_DIR": str(tmp_path / "fcache")}
    shown = subprocess.run(
        [sys.executable, "-m", "fcache.cli", "stats", "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["dynamic"]["compiles"] == 1

    warm = _run(tmp_path, [20, 9, 16], "warm")  # 20 and 9 never seen
    for row in warm["rows"]:
        assert row["compiles"] == 0 and row["dynamic_compiled"] == 0, row
    # One stored function loaded: the dynamic one, whose guards accept 16 too.
    assert warm["rows"][-1]["functions_loaded"] == 1
    assert warm["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert warm["aot"].get("autograd_cache_miss", 0) == 0


def test_dynamic_keys_leave_out_only_the_dynamic_sizes() -> None:
    from fcache.engine.whole.key import ALL, call_key

    class Session:
        settings = type("S", (), {"executors": None, "regions": "default"})()

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y

    def key(x: torch.Tensor, y: torch.Tensor, wildcard: object = None) -> str:
        return call_key(f, None, (x, y), {}, None, Session(), wildcard)  # type: ignore[arg-type]

    a, b = torch.zeros(2, 16), torch.zeros(2, 8)
    seq = frozenset({("a0", 1), ("a1", 1)})
    assert key(a, a) != key(b, b)
    assert key(a, a, seq) == key(b, b, seq) == key(b, a, seq)
    assert key(a, a, seq) != key(torch.zeros(3, 16), a, seq)  # the batch is not dynamic
    assert key(a, a, seq) != key(a, a, ALL) == key(torch.zeros(3, 4), b, ALL)
    assert key(a, a, seq) != key(a.double(), a, seq)
    assert key(a, a, ALL) != call_key(f, None, (a, a), {}, None, Session(), ALL, marker=True)


def test_symbolic_graphs_are_told_apart() -> None:
    from fcache.engine import dynamic

    seen: list[bool] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        seen.append(dynamic.is_symbolic(gm, inputs))
        return gm.forward

    fn = torch.compile(lambda x: x.sin() * 2, backend=backend, dynamic=None)
    torch._dynamo.reset()
    fn(torch.randn(4, 3))
    fn(torch.randn(5, 3))  # the second size: dynamic
    torch._dynamo.reset()
    assert seen == [False, True]


def test_torch_compiles_route_compiles_a_symbolic_graph_once(tmp_path: Path) -> None:
    """Without the whole route (FCACHE_WHOLE=0, a graph break, backend="fcache"), Dynamo's
    automatic dynamic hands fcache's backend a graph with symbolic sizes at the second
    size: compiled by Inductor once, counted, right at every size after."""
    import fcache

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * x.shape[0] + x.sum(0)

    torch._dynamo.reset()
    settings = fcache.Settings(
        cache_dir=tmp_path / "cache", progress=False, executors=("eager",), whole=False
    )
    compiled = fcache.jit(f, settings=settings)
    for n in (8, 6, 5, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x), f(x))
    stats = fcache.stats(compiled)
    assert stats.dynamic_compiled + stats.dynamic_loaded == 1
    torch._dynamo.reset()


def test_dimensions_go_dynamic_at_a_second_size_and_are_remembered(tmp_path: Path) -> None:
    """fcache.engine.whole.dims: dynamic=False keeps exact keys; None makes a dimension
    dynamic once seen at a second size, and a new process (a new backend over the same
    cache) reads that from the marker; True leaves every size out."""
    import fcache
    from fcache.engine.backend import Backend
    from fcache.engine.compile.session import Session
    from fcache.engine.record import ModelRecord
    from fcache.engine.whole import dims

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    session = Session.get(fcache.Settings(cache_dir=tmp_path / "cache", progress=False))

    def keys(backend: Backend, n: int, dynamic: bool | None) -> tuple:
        return dims.keys(f, None, (torch.zeros(2, n),), {}, dynamic, backend)

    backend = Backend(session, ModelRecord())
    exact, dyn, found = keys(backend, 16, False)
    assert exact and dyn is None and found is None
    assert keys(backend, 16, None)[1] is None  # one size seen: static
    exact8, dyn8, found8 = keys(backend, 8, None)
    assert dyn8 is not None and found8 == frozenset({("a0", 1)}) and exact8 != exact
    assert keys(backend, 12, None)[1] == dyn8  # every length: one key
    fresh = Backend(session, ModelRecord())  # another process: the marker says so
    assert keys(fresh, 20, None)[1:] == (dyn8, found8)
    assert keys(fresh, 20, True)[0] is None and keys(fresh, 20, True)[1] == keys(fresh, 3, True)[1]


def test_a_size_the_trace_pinned_to_one_value_is_static() -> None:
    """A dimension that went dynamic but that the trace then pinned (transformers 5.17's
    generation mask at the first decode step: its length must equal the cache's plus one)
    is one size: its graph is cut into regions, not compiled by Inductor as dynamic."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    from fcache.engine import dynamic

    env = ShapeEnv()

    def size(name: str, hint: int) -> torch.SymInt:
        symbol = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return env.create_symintnode(symbol, hint=hint)

    pinned, free = size("mask", 17), size("cache", 16)
    assert dynamic._symbolic(pinned) and dynamic._symbolic(free)
    torch._check(pinned == 17)  # a guard that leaves the symbol one value
    assert not dynamic._symbolic(pinned) and dynamic._symbolic(free)
    with FakeTensorMode(shape_env=env):  # a tensor sized by them
        assert dynamic._symbolic(torch.empty(free, 3))
        assert not dynamic._symbolic(torch.empty(pinned, 3))
