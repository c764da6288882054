"""Stored programs (fcache.engine.programs.graph, issue #14): a warm process finds its graphs in
torch's AOTAutograd cache and runs no AOTAutograd trace and no partitioning; a model with
one op changed misses the stored program but still hits its unchanged regions.

Every run is a fresh process sharing one fcache directory and one Inductor directory
(where torch keeps AOTAutograd's entries); regions go to the text executor
(tests/text_executor.py), which stores them as a compiler would.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fcache.engine.programs.plan import Plan, PlanMismatch
from fcache.frontend import graph_text
from fcache.frontend.partition import partition
from tests import fresh
from tests.graphs import capture

ROOT = Path(__file__).resolve().parents[3]

_RUN = """
import json, sys, types
sys.path.insert(0, {root!r})
import torch, torch.nn.functional as F
import fcache
import fcache.engine.compile.session as session_module
from torch._dynamo.utils import compilation_time_metrics, counters
from fcache.examples.models import ModelConfig, build, sample_tokens
from tests.text_executor import register

register()
if {inductor_first!r}:  # as a process that compiled with Inductor before would have
    from torch._inductor.codegen.common import init_backend_registration
    init_backend_registration()
cuts = []
partition = session_module.partition
session_module.partition = lambda graph, **kw: cuts.append(1) or partition(graph, **kw)

cfg = ModelConfig(family="gpt", layers=3, dim=32, heads=2, vocab=64, max_seq=16)
model, reference = build(cfg), build(cfg)
if {changed!r}:  # one op different in the first block's MLP: relu instead of gelu
    for m in (model, reference):
        mlp = m.blocks[0].mlp
        mlp.forward = types.MethodType(lambda self, x: self.proj(F.relu(self.fc(x))), mlp)
tokens = sample_tokens(cfg, 2, 8)
settings = fcache.Settings.from_env().replace(progress=False, executors=("text", "eager"))
compiled = fcache.jit(model, settings=settings)
loss = compiled(tokens).float().square().mean()
loss.backward()
expected = reference(tokens).float().square().mean()
expected.backward()
error = max((p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), reference.parameters()))
stats = fcache.stats(compiled)
print(json.dumps({{
    "aot": dict(counters["aot_autograd"]), "partitions": len(cuts),
    "programs_loaded": stats.programs_loaded, "compiles": stats.compiles,
    "unique_regions": stats.unique_regions, "hits": stats.hits,
    "loss": [loss.item(), expected.item()], "grad_error": error,
    "codegen_imported": "torch._inductor.codegen.halide" in sys.modules,
    "sources_hashed": "inductor_codecache_torch_key" in compilation_time_metrics,
}}))
"""


def _run(
    tmp_path: Path, changed: bool = False, inductor: str = "inductor", inductor_first: bool = False
) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FCACHE_DIR": str(tmp_path / "fcache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / inductor),
        # The route through Dynamo and stored programs (whole stored functions skip it:
        # tests/unit/engine/test_whole.py); graph-broken models and FCACHE_WHOLE=0 take it.
        "FCACHE_WHOLE": "0",
    }
    script = _RUN.format(root=str(ROOT), changed=changed, inductor_first=inductor_first)
    proc = fresh.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["loss"][0] == pytest.approx(report["loss"][1], rel=1e-6)
    assert report["grad_error"] < 1e-5
    return report


@pytest.fixture(scope="module")
def cold_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`_run` cold, once for the module: the directory holding its fcache and Inductor
    directories (each test copies them, so that none sees another's entries), its report."""
    base = tmp_path_factory.mktemp("cold")
    return base, _run(base)


def _cold_copy(cold_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    """`_run(tmp_path)` as it would come out: the module's cold run, copied to `tmp_path`."""
    base, report = cold_run
    for name in ("fcache", "inductor"):
        shutil.copytree(base / name, tmp_path / name)
    return report


def test_a_warm_process_skips_aotautograd_and_partitioning(
    cold_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    cold = _cold_copy(cold_run, tmp_path)
    assert cold["aot"].get("autograd_cache_saved") == 1
    assert cold["partitions"] == 2  # forward and backward
    assert cold["compiles"] == cold["unique_regions"] > 0

    warm = _run(tmp_path)
    assert warm["aot"].get("autograd_cache_hit") == 1  # no AOTAutograd trace
    assert warm["aot"].get("autograd_cache_miss", 0) == 0
    assert warm["partitions"] == 0
    assert warm["programs_loaded"] == 2
    assert warm["compiles"] == 0 and warm["hits"] == {"local": cold["unique_regions"]}
    # Looking the program up imported none of Inductor's code generators and hashed no
    # torch source file (fcache.engine.programs.key).
    assert not warm["codegen_imported"] and not warm["sources_hashed"]

    changed = _run(tmp_path, changed=True)
    assert changed["aot"].get("autograd_cache_miss") == 1  # another Dynamo graph
    assert changed["partitions"] == 2 and changed["programs_loaded"] == 0
    assert 0 < changed["compiles"] < changed["unique_regions"]
    assert changed["hits"]["local"] == changed["unique_regions"] - changed["compiles"]


def test_programs_are_found_in_fcaches_tiers_without_inductors_directory(
    cold_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Another machine, container or cleaned /tmp: only FCACHE_DIR (or the server) is warm."""
    cold = _cold_copy(cold_run, tmp_path)
    warm = _run(tmp_path, inductor="inductor-empty")
    assert warm["aot"].get("autograd_cache_hit") == 1  # from fcache's local tier
    assert warm["partitions"] == 0 and warm["programs_loaded"] == 2
    assert warm["compiles"] == 0
    assert warm["hits"] == {"local": cold["unique_regions"]}


def test_a_program_has_one_key_whether_or_not_inductor_registered_its_backends(
    cold_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The key leaves out Inductor's backend registration (fcache.engine.programs.key): a
    process that compiled with Inductor first finds the program another process stored,
    and a program it stores is found by a process that did not."""
    _cold_copy(cold_run, tmp_path)
    after_inductor = _run(tmp_path, inductor="inductor-2", inductor_first=True)
    assert after_inductor["codegen_imported"]  # registration did happen in that process
    assert after_inductor["programs_loaded"] == 2 and after_inductor["partitions"] == 0

    other = tmp_path / "other"
    _run(other, inductor_first=True)
    plain = _run(other, inductor="inductor-2")
    assert plain["programs_loaded"] == 2 and plain["partitions"] == 0


def _graph() -> torch.fx.GraphModule:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (torch.nn.functional.gelu(x @ w) * 2).sum(dim=-1)

    (forward, _) = capture(f, torch.randn(4, 8, requires_grad=True), torch.randn(8, 8))
    return forward


def test_graph_text_round_trips_and_keeps_values_for_who_asks() -> None:
    gm = _graph()
    text = graph_text.dumps(gm)
    graph = graph_text.loads(text)
    assert [n.name for n in graph.nodes] == [n.name for n in gm.graph.nodes]
    assert [str(n.target) for n in graph.nodes] == [str(n.target) for n in gm.graph.nodes]
    assert all("val" not in n.meta for n in graph.nodes)  # no fake tensors unless asked
    graph_text.with_values(graph)
    for mine, theirs in zip(graph.nodes, gm.graph.nodes, strict=True):
        if isinstance(theirs.meta.get("val"), torch.Tensor):
            assert mine.meta["val"].shape == theirs.meta["val"].shape
            assert mine.meta["val"].stride() == theirs.meta["val"].stride()
    assert graph_text.dumps(torch.fx.GraphModule(torch.nn.Module(), graph)) == text


def test_a_plan_rebuilds_the_partition_and_refuses_a_graph_it_does_not_fit() -> None:
    from fcache.engine.compile.jobs import canonical_forms

    gm = _graph()
    parts = partition(gm.graph)
    canonical = canonical_forms(parts.regions)
    plan = Plan.from_json(Plan.of(gm.graph, parts, canonical, {}).to_json())
    again, forms = plan.apply(gm.graph)
    assert [type(s).__name__ for s in again.steps] == [type(s).__name__ for s in parts.steps]
    assert [f.text for f in forms.values()] == [canonical[r].text for r in parts.regions]
    other = capture(lambda x: x.sin() + 1, torch.randn(3), backward=False)[0]
    with pytest.raises(PlanMismatch):
        plan.apply(other.graph)


def test_a_program_miss_is_announced_once_per_lookup_and_a_hit_is_not(tmp_path: Path) -> None:
    """What starts the compile workers early (Session.prestart): a look-up that finds no
    stored program calls `on_miss`; one that finds it does not."""
    from fcache.cache.tiered import TieredCache
    from fcache.config import Settings
    from fcache.engine.programs.store import ProgramBackend
    from fcache.stats import CacheStats

    misses: list[int] = []
    cache = TieredCache.open(Settings(cache_dir=tmp_path, progress=False), CacheStats())
    try:
        backend = ProgramBackend(cache, torch.__version__, lambda: misses.append(1))
        assert backend.get("some-torch-key") is None
        assert misses == [1]
        backend.put("some-torch-key", b'{"a stored": "program"}')
        assert backend.get("some-torch-key") == b'{"a stored": "program"}'
        assert misses == [1]
    finally:
        cache.close()
