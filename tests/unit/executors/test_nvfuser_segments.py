"""Cutting a region along nvFuser's segments, checked on CPU against real nvFuser output.

The fixtures in data/nvfuser_segments are what nvFuser 0.2.36 printed on an H100 for
three regions of the Llama example (d=1024, 2x2048 tokens, bf16) through
`FusionExecutorCache.get_scheduled_ir`, with the region's canonical text and the tensor
names fcache's translation gave each region value (`{ref: [TN_...]}`). The regions are
run on CPU here (their device rewritten), step by step and whole: the results must be
identical, bit for bit, since a step computes whole aten ops on whole aten values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import fx

from fcache.executors.nvfuser import segments as seg
from fcache.frontend.canonicalize import CanonicalRegion, Ref, TensorSpec, parse
from tests.graphs import random_inputs

DATA = Path(__file__).parent / "data" / "nvfuser_segments"


def _number(name: str) -> int:
    match = re.match(r"T(\d+)_", name)
    assert match, name
    return int(match.group(1))


def fixture(name: str) -> tuple[str, CanonicalRegion, seg.Names]:
    ir = (DATA / f"{name}.ir.txt").read_text()
    text = (DATA / f"{name}.region.json").read_text().replace('"cuda"', '"cpu"')
    region = parse(text.encode())
    recorded = json.loads((DATA / f"{name}.names.json").read_text())
    # The fusion's outputs, in order, as nvFuser lists them in the complete fusion.
    listed = ir.split("Outputs:\n", 1)[1].split("\n\n", 1)[0]
    outputs = [int(n) for n in re.findall(r"^\s+T(\d+)_", listed, re.MULTILINE)]
    names = seg.Names(
        [_number(recorded[f"in{i}"][0]) for i in range(len(region.inputs))],
        [[_number(n) for n in recorded[f"node{j}"]] for j in range(len(region.nodes))],
        outputs,
        region,
    )
    return ir, region, names


def node_values(region: CanonicalRegion, inputs: list[torch.Tensor]) -> list[object]:
    """Every node's value when the region runs whole on `inputs`, in node order."""
    values: list[object] = []
    interpreter = fx.Interpreter(region.materialize(torch.device("cpu")))
    run_node = interpreter.run_node

    def record(node: fx.Node) -> object:
        value = run_node(node)
        if node.op == "call_function":
            values.append(value)
        return value

    interpreter.run_node = record  # type: ignore[method-assign]
    interpreter.run(*inputs)
    return values


def run_steps(
    region: CanonicalRegion, steps: list[seg.Step], inputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    env: dict[Ref, torch.Tensor] = {Ref("in", i): t for i, t in enumerate(inputs)}
    for step in steps:
        sub = step.region(region, lambda ref: TensorSpec.of(env[ref]))
        assert len(sub.inputs) == len(step.inputs) and len(sub.outputs) == len(step.outputs)
        outputs = sub.materialize(torch.device("cpu"))(*[env[r] for r in step.inputs])
        env.update(zip(step.outputs, outputs, strict=True))
    return [env[r] for r in region.outputs]


@pytest.mark.parametrize(
    ("name", "segments", "steps"),
    [
        # RoPE on q and k: per rotated tensor, two pointwise kernels and a cat.
        ("rope_forward", 8, 6),
        # A reduction, then a persistent normalization kernel that reads it.
        ("rmsnorm_backward_a", 4, 2),
    ],
)
def test_segmented_region_runs_as_steps_exactly_like_whole(
    name: str, segments: int, steps: int
) -> None:
    ir, region, names = fixture(name)
    found = seg.parse(ir)
    assert found is not None and len(found.segments) == segments
    inputs = random_inputs(region, 0)
    values = node_values(region, inputs)
    plan = seg.plan(
        region, found, names, lambda r: r.kind == "in" or torch.is_tensor(values[r.index])
    )
    assert plan is not None and len(plan) == steps
    # Every step is a proper part of the region. A cheap op may be in two steps, as nvFuser
    # repeats an input's upcast in each segment that reads it.
    assert all(0 < len(step.nodes) < len(region.nodes) for step in plan)
    want = region.materialize(torch.device("cpu"))(*inputs)
    got = run_steps(region, plan, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_one_kernel_and_its_output_copies_stay_one_fusion() -> None:
    # nvFuser cut this region only to give its outputs their layouts (copy segments):
    # one real step is no cut at all.
    ir, region, names = fixture("rmsnorm_backward_b")
    found = seg.parse(ir)
    assert found is not None
    assert sorted(s.scheduler for s in found.segments) == [
        "expr_eval",
        "expr_eval",
        "inner_outer_persistent",
    ]
    assert seg.plan(region, found, names, lambda r: True) is None


def test_an_unsegmented_fusion_has_nothing_to_cut() -> None:
    ir, _, _ = fixture("rope_forward")
    kernel_only = ir.split("Segmented_Fusion{", 1)[0].replace("Segmented_Fusion Dump", "")
    assert seg.parse(kernel_only) is None
    assert seg.parse("") is None


def test_a_boundary_without_a_region_value_keeps_the_region_whole() -> None:
    ir, region, names = fixture("rope_forward")
    found = seg.parse(ir)
    assert found is not None

    def lost(name: int) -> Ref | None:
        return None if name == found.segments[0].outputs[0] else names(name)

    assert seg.plan(region, found, lost, lambda r: True) is None
    # A tuple-valued boundary (is_tensor False) cannot be a step's input or output.
    assert seg.plan(region, found, names, lambda r: r.kind == "in") is None


def test_names_map_every_tensor_to_the_node_that_defined_it() -> None:
    region = parse(
        (DATA / "rope_forward.region.json").read_text().replace('"cuda"', '"cpu"').encode()
    )
    # inputs T0..T1; node 0 defines T2..T4 (its result T4), node 1 only aliases T4,
    # node 2 is a tuple (T5, T6); outputs T7, T8.
    names = seg.Names([0, 1], [[4], [4], [5, 6]], [7, 8], region)
    assert names(0) == Ref("in", 0) and names(1) == Ref("in", 1)
    assert names(2) == names(3) == names(4) == Ref("node", 0)
    assert names(5) == names(6) == Ref("node", 2)
    assert names(7) == region.outputs[0] and names(8) == region.outputs[1]
    assert names(99) is None
