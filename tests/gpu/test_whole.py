"""Whole stored functions on the GPU (fcache.engine.whole.route), default executors: a warm
process with empty Inductor and Triton directories runs no Dynamo, and its outputs and
gradients match eager (checked in tests/unit/engine/test_whole.py's `run`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.engine.test_whole import run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# Gemma2 and Falcon hold a small CUDA tensor in AOTAutograd's entry, which torch 2.11
# pickled inside the fake mode and failed to store (fcache.engine.programs.store).
@pytest.mark.parametrize("variant", ["plain", "hf-llama", "hf-gpt2", "hf-gemma2", "hf-falcon"])
def test_a_warm_gpu_process_traces_nothing(tmp_path: Path, variant: str) -> None:
    if variant.startswith("hf-"):
        pytest.importorskip("transformers")
    cold = run(tmp_path, variant, device="cuda", TRITON_CACHE_DIR=str(tmp_path / "t1"))
    assert cold["compiles"] > 0
    warm = run(tmp_path, variant, device="cuda", TRITON_CACHE_DIR=str(tmp_path / "t2"))
    assert warm["functions_loaded"] == 2 and warm["frames"] == 0
    assert warm["compiles"] == 0


@pytest.mark.parametrize("variant", ["hf-llama", "hf-gpt2"])
def test_blocks_on_the_gpu_trace_one_layer_and_a_warm_process_none(
    tmp_path: Path, variant: str
) -> None:
    pytest.importorskip("transformers")
    cold = run(tmp_path, variant, "cuda", True, TRITON_CACHE_DIR=str(tmp_path / "t1"))
    # Two input shapes; per shape one layer traced, and each module outside the layers
    # (Llama: embedding, norm, output layer; GPT-2 adds its position embedding, whose
    # input is the same at both batch sizes: traced once). As many loads when warm.
    traced = 2 * (1 + 3) if variant == "hf-llama" else 2 * (1 + 3) + 1
    assert cold["frames"] == traced and cold["compiles"] > 0
    warm = run(tmp_path, variant, "cuda", True, TRITON_CACHE_DIR=str(tmp_path / "t2"))
    assert warm["frames"] == 0 and warm["compiles"] == 0
    assert warm["functions_loaded"] == traced


def test_entries_pickle_a_cuda_tensor_inside_a_fake_mode() -> None:
    import pickle

    from torch._subclasses.fake_tensor import FakeTensorMode

    from fcache.engine.programs.store import OutsideModes

    real = torch.arange(8, dtype=torch.uint8, device="cuda")
    with FakeTensorMode():
        data = OutsideModes(pickle).dumps({"constant": real})
    assert torch.equal(pickle.loads(data)["constant"], real)
