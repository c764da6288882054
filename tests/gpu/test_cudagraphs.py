"""CUDA graphs for the stitched program (Settings.cuda_graphs): steps replayed from CUDA
graphs give eager's loss and gradients, step after step, and torch's CUDA-graph trees
captured the graphs (no skip); parameters are read in place, not copied into the graphs'
pool at every replay; the graphs are captured once and then replayed, step after step;
a warm process loads the whole stored function (no Dynamo) and replays it just as well.
Skipped without CUDA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fcache
from fcache import process
from fcache.examples.models import ModelConfig, build, sample_tokens
from tests.fresh import ROOT, run_json

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


_RUN = """
import json, sys
sys.path.insert(0, {root!r})
import torch
import fcache
from torch._dynamo.utils import counters
from torch._inductor.cudagraph_trees import get_manager
from fcache.examples.models import ModelConfig, build, sample_tokens

# Parameters (a 16k vocabulary: 40 MB) far larger than what a step makes (8 tokens).
cfg = ModelConfig(family="llama", layers=2, dim=256, heads=4, vocab=16384, max_seq=16)
model, reference = build(cfg).cuda(), build(cfg).cuda()
tokens = sample_tokens(cfg, 1, 8).cuda()
expected = reference(tokens).float().square().mean()
expected.backward()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
from torch._inductor import cudagraph_trees
recordings = []  # graphs captured: they stop once steps replay
record = cudagraph_trees.CUDAGraphTreeManager.record_function
cudagraph_trees.CUDAGraphTreeManager.record_function = (
    lambda self, *a, **k: recordings.append(1) or record(self, *a, **k))
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
settings = fcache.Settings.from_env().replace(progress=False, cuda_graphs=True)
compiled = fcache.jit(model, settings=settings)
errors, captured = [], []
for _ in range(6):  # warm-up, capture, then replays
    model.zero_grad(set_to_none=True)
    loss = compiled(tokens).float().square().mean()
    loss.backward()
    grads = max((p.grad - q.grad).abs().max().item()
                for p, q in zip(model.parameters(), reference.parameters()))
    errors.append([abs(loss.item() - expected.item()) / expected.item(), grads])
    captured.append(len(recordings))
torch.cuda.synchronize()
print(json.dumps({{
    "errors": errors, "skips": counters["inductor"]["cudagraph_skips"],
    "graphs": get_manager(0, create_if_none_exists=False) is not None,
    "loaded": fcache.stats(compiled).functions_loaded,
    "grown": torch.cuda.memory_allocated() - before, "weights": weights, "captured": captured,
}}))
"""


def _run(tmp_path: Path) -> dict[str, Any]:
    report = run_json(
        _RUN.format(root=str(ROOT)),
        FCACHE_DIR=str(tmp_path / "fcache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"inductor-{len(list(tmp_path.glob('*')))}"),
    )
    for loss, grads in report["errors"]:
        assert loss < 1e-4 and grads < 1e-4, report["errors"]
    assert report["skips"] == 0 and report["graphs"], report
    # Captured once (forward and backward), then replayed: no step records anew.
    captured = report["captured"]
    assert captured[-1] == captured[-3] > 0, captured
    # What stays allocated: the gradients (as large as the weights) and a step's few
    # tensors; a copy of every weight in the pool would make it twice the weights.
    assert report["grown"] < 1.5 * report["weights"], report
    return report


def test_parameters_are_read_in_place_and_a_warm_process_replays_its_stored_function(
    tmp_path: Path,
) -> None:
    cold = _run(tmp_path)
    assert cold["loaded"] == 0
    warm = _run(tmp_path)
    assert warm["loaded"] == 1  # the whole stored function: no Dynamo, CUDA graphs still on


def test_generate_with_a_static_cache_replays_its_decode_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compiled.generate` with a static cache: the decode step writes into the cache, and
    is replayed as a CUDA graph only if those inputs are static addresses (fcache.engine
    .generate marks them; unmarked, the H200 skipped every decode graph for "mutated
    inputs", bench/results/gpu-2026-11-29). The tokens are eager's."""
    transformers = pytest.importorskip("transformers")
    from torch._inductor import cudagraph_utils

    skips: list[str] = []
    skip = cudagraph_utils.log_cudagraph_skip_and_bump_counter
    monkeypatch.setattr(
        cudagraph_utils,
        "log_cudagraph_skip_and_bump_counter",
        lambda message: skips.append(message) or skip(message),
    )
    torch._dynamo.reset()
    process.reset()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, 256, (2, 16), device="cuda")
    options = dict(do_sample=False, max_new_tokens=8, cache_implementation="static",
                   max_cache_len=64, disable_compile=True)  # fmt: skip
    settings = fcache.Settings(cache_dir=tmp_path, progress=False, cuda_graphs=True)
    with torch.no_grad():
        expected = model.generate(ids, **options)
        compiled = fcache.jit(model, settings=settings)
        for _ in range(2):  # the second call replays what the first captured
            assert torch.equal(compiled.generate(ids, **options), expected)
    assert not [m for m in skips if "mutated inputs" in m], skips
    # Something was captured: the decode step (the prefill reads a CPU tensor, skipped).
    assert torch._inductor.cudagraph_trees.get_manager(0, create_if_none_exists=False)
