"""Key pairs: same region -> same key; any one kernel-changing component -> another key."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from fcache.executors.inductor import InductorExecutor
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.key import make_key
from fcache.frontend.partition import partition
from fcache.target import Target
from tests import fresh
from tests.graphs import capture

CPU = Target("cpu", "avx2")
TOOLCHAIN = {"torch": "2.13.0"}


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _key(
    fn=_rmsnorm, x=None, w=None, target=CPU, executor="inductor", version="1", toolchain=TOOLCHAIN
):
    x = torch.randn(4, 8) if x is None else x
    w = torch.randn(8) if w is None else w
    (gm,) = capture(fn, x, w, backward=False)
    (region,) = partition(gm.graph).regions
    return make_key(canonicalize(region), target, executor, version, toolchain)


def test_same_region_same_key() -> None:
    assert _key().digest == _key().digest
    # Different values, same metadata: values never reach the key.
    assert _key(x=torch.ones(4, 8)).digest == _key(x=torch.zeros(4, 8)).digest


def test_renamed_parameters_give_the_same_key() -> None:
    def renamed(hidden_states: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        return (
            hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
        )

    assert _key(renamed).digest == _key().digest


@pytest.mark.parametrize(
    "change",
    [
        {"x": torch.randn(4, 8, dtype=torch.float64), "w": torch.randn(8, dtype=torch.float64)},
        {"x": torch.randn(4, 16), "w": torch.randn(16)},
        {"x": torch.randn(8, 4).t()},  # same shape, transposed strides
        {"fn": lambda x, w: _rmsnorm(x, w, eps=1e-6)},
        {"fn": lambda x, w: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-5) * w},
        {"target": Target("cpu", "avx512")},
        {"target": Target("cuda", "sm_90")},
        {"executor": "nvfuser"},
        {"version": "2"},
        {"toolchain": {"torch": "2.11.0"}},
        {"toolchain": {**TOOLCHAIN, "triton": "3.6.0"}},
    ],
    ids=[
        "dtype",
        "shape",
        "strides",
        "constant",
        "op",
        "isa",
        "device",
        "executor",
        "executor-version",
        "torch",
        "extra-toolchain",
    ],
)
def test_any_kernel_changing_component_changes_the_key(change: dict) -> None:
    base = _key()
    changed = _key(**change)
    assert changed.digest != base.digest
    # The toolchain may gain a component; the shared ones must show which one changed.
    pairs = zip(base.components, changed.components, strict=False)
    differing = {n for (n, v), (_, w) in pairs if v != w}
    assert differing or len(base.components) != len(changed.components)


def test_key_components_are_named_and_include_the_toolchain() -> None:
    key = _key()
    names = [name for name, _ in key.components]
    assert names[:4] == ["format", "region", "target", "executor"]
    assert key.component("toolchain.torch") == "2.13.0"
    assert len(key.digest) == 32


def test_inductor_toolchain_names_torch_version() -> None:
    chain = InductorExecutor().toolchain(Target("cpu", "avx2"))
    assert torch.__version__ in chain["torch"]
    assert "triton" not in chain  # CPU kernels do not depend on Triton


def test_inductor_options_are_keyed_per_device_type() -> None:
    # CUDA packages are built without the CPU vector-ISA probe (they have no CPU kernels);
    # CPU ones need it. Options that differ must give different keys.
    cpu = InductorExecutor().toolchain(Target("cpu", "avx2"))["options"]
    cuda = InductorExecutor().toolchain(Target("cuda", "sm_90"))["options"]
    assert "cpp.vec_isa_ok" in cuda and "cpp.vec_isa_ok" not in cpu


_PROBE = """
import json, sys
sys.path.insert(0, {root!r})
from tests.unit.frontend.test_key import _key
from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.frontend.canonicalize import canonicalize
from fcache.frontend.key import make_key
from fcache.target import Target
from fcache.frontend.partition import partition
from tests.graphs import capture
cfg = ModelConfig(layers=2, dim=32, heads=2, vocab=64, max_seq=16)
keys = [make_key(canonicalize(r), Target("cpu", "avx2"), "inductor", "1", {{"torch": "x"}}).digest
        for gm in capture(build(cfg), sample_tokens(cfg, 2, 8))
        for r in partition(gm.graph).regions]
print(json.dumps(keys))
"""


def test_keys_are_identical_across_processes_with_different_hash_seeds() -> None:
    root = str(Path(__file__).resolve().parents[3])
    results = []
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = fresh.run(
            [sys.executable, "-c", _PROBE.format(root=root)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0] == results[1]
    assert len(results[0]) > 4
