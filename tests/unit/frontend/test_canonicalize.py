"""Canonical form: name-free, exact, and parseable back into a runnable graph."""

from __future__ import annotations

import math

import torch

from fcache.examples.models import ModelConfig, build, sample_tokens
from fcache.frontend.canonicalize import canonicalize, parse
from fcache.frontend.partition import partition
from tests.graphs import capture


def _regions(fn, *args, backward=False):
    graphs = capture(fn, *args, backward=backward)
    return [r for gm in graphs for r in partition(gm.graph).regions]


def test_text_round_trips_through_parse() -> None:
    cfg = ModelConfig(layers=2, dim=32, heads=2, vocab=64, max_seq=16)
    for region in _regions(build(cfg), sample_tokens(cfg, 2, 8), backward=True):
        canon = canonicalize(region)
        again = parse(canon.text)
        assert again == canon
        assert again.nodes == canon.nodes and again.inputs == canon.inputs


def test_materialized_region_computes_what_the_nodes_compute() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x * y, -y).sum(dim=0) / 3.0

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    (region,) = _regions(f, x, y)
    module = canonicalize(region).materialize(torch.device("cpu"))
    (got,) = module(x, y)
    torch.testing.assert_close(got, f(x, y))


def test_non_finite_constants_survive_the_text_form() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=-math.inf, max=math.inf).masked_fill(x > 1, math.nan) * 2

    (region,) = _regions(f, torch.randn(3))
    canon = canonicalize(region)
    assert b"inf" in canon.text and b"nan" in canon.text
    again = parse(canon.text)
    constants = [a for n in again.nodes for a in n.args if isinstance(a, float)]
    assert -math.inf in constants and math.inf in constants
    assert any(math.isnan(c) for c in constants)


def test_names_and_layer_positions_do_not_reach_the_text() -> None:
    cfg = ModelConfig(layers=3, dim=32, heads=2, vocab=64, max_seq=16)
    texts = [canonicalize(r).text for r in _regions(build(cfg), sample_tokens(cfg, 2, 8))]
    # The middle layer's regions appear again, identical, in another layer.
    assert len(set(texts)) < len(texts)
    for text in texts:
        assert b"blocks" not in text and b"primals" not in text and b"layer" not in text


def test_inductor_prims_resolve_in_a_process_that_never_imported_inductor() -> None:
    # A compile worker or warm process meets prims.fma (Inductor's CUDA decompositions emit
    # it) before anything has imported torch._inductor.inductor_prims, which registers it.
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from fcache.frontend.canonicalize import resolve_op\n"
        "assert not hasattr(torch.ops.prims, 'fma')\n"
        "print(resolve_op('prims.fma.default'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "prims.fma.default"
