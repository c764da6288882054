"""nvFuser's segmentation, kept: a segmented region becomes one fusion per segment.

nvFuser 0.2.36 cannot persist what it decided for a fusion, and its segmentation search
(try to merge groups of ops, ask every scheduler whether it can take the merged group,
repeat) is most of what a warm load of a multi-kernel fusion costs. A fusion that one
scheduler takes whole skips the search: nvFuser proposes one kernel for the whole fusion
and stops. So after a cold compile fcache reads the segments nvFuser chose and cuts the
region along them into *steps*, sub-regions of whole aten ops that each define a fusion
of their own; a warm load defines those fusions, each taken whole at the first try.

Pure Python (no nvFuser, no GPU), in three parts:
  - `parse` reads the segments from `FusionExecutorCache.get_scheduled_ir` (the only view
    of them Python has): each segment's input and output tensors, by name (the N of `TN`),
    and the `Set` / `SegmenterSet` copies nvFuser added, to see through them;
  - `Names` maps a tensor name back to the region value it is part of: fcache's
    translation records the names of each value's tensors, and every tensor defined while
    a node was translated (its casts, broadcasts) belongs to that node;
  - `plan` turns segments into steps: each segment's outputs, as region values, computed
    from its inputs, as region values; `Step.region` is the step as a canonical region.
A cut at a region value is always correct, whatever nvFuser meant (a step computes whole
aten ops from whole aten values), so a mapping that lands a little off only costs speed.
Where a segment boundary has no region value (a tuple-valued node, a tensor nvFuser
made), `plan` returns None and the region stays one fusion.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fcache.frontend.canonicalize import (
    CanonicalNode,
    CanonicalRegion,
    Ref,
    TensorSpec,
    region_of,
)

_TENSOR = re.compile(r"^\s*T(\d+)_")
_COPY = re.compile(r"^T(\d+)_[^\n]*\n\s+= (?:SegmenterSet|Set)\( T(\d+)_", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Segment:
    """One of nvFuser's segments: its scheduler and its tensors, by name."""

    scheduler: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Segmentation:
    segments: tuple[Segment, ...]
    copies: Mapping[int, int]  # T_a = Set(T_b) or SegmenterSet(T_b): a -> b


def parse(scheduled_ir: str) -> Segmentation | None:
    """The segments in a `get_scheduled_ir` dump; None for a fusion nvFuser did not cut."""
    if "group details:" not in scheduled_ir:
        return None
    details = scheduled_ir.split("group details:", 1)[1]
    segments = []
    for block in details.split("\ng{")[1:]:
        header, _, rest = block.partition("\n")
        scheduler = header.strip("()") or "none"
        ins: list[int] = []
        outs: list[int] = []
        section: list[int] | None = None
        for line in rest.splitlines():
            if line.startswith("inputs:"):
                section = ins
            elif line.startswith("outputs:"):
                section = outs
            elif not line.strip():
                if section is outs:
                    break
            elif section is not None and (match := _TENSOR.match(line)):
                section.append(int(match.group(1)))  # scalars (extents, i288) are skipped
        segments.append(Segment(scheduler, tuple(ins), tuple(outs)))
    complete = scheduled_ir.split("group details:", 1)[0]
    copies = {int(a): int(b) for a, b in _COPY.findall(complete)}
    return Segmentation(tuple(segments), copies) if segments else None


class Names:
    """Tensor name -> the region value it belongs to.

    `inputs[i]` and `outputs[k]` are the names of the fusion's input and output tensors;
    `nodes[j]` the names of node j's result tensors (several for a tuple-valued node).
    nvFuser names tensors in the order they are defined, so a tensor defined while node j
    was translated has a name above every name of nodes before j and at most the largest
    of node j's own."""

    def __init__(
        self,
        inputs: Sequence[int],
        nodes: Sequence[Sequence[int]],
        outputs: Sequence[int],
        region: CanonicalRegion,
    ) -> None:
        self._exact: dict[int, Ref] = {n: Ref("in", i) for i, n in enumerate(inputs)}
        self._exact.update({n: region.outputs[k] for k, n in enumerate(outputs)})
        self._ceilings: list[int] = []  # running maximum of the names up to node j
        top = max(inputs, default=-1)
        for j, names in enumerate(nodes):
            if len(names) == 1:  # a tensor; a getitem names its element of a tuple this way
                self._exact.setdefault(names[0], Ref("node", j))
            top = max([top, *names])
            self._ceilings.append(top)

    def __call__(self, name: int) -> Ref | None:
        if name in self._exact:
            return self._exact[name]
        j = bisect.bisect_left(self._ceilings, name)
        return Ref("node", j) if j < len(self._ceilings) else None


@dataclass(frozen=True, slots=True)
class Step:
    """Nodes of the parent region (indices, in order) that compute `outputs` from `inputs`."""

    nodes: tuple[int, ...]
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]

    def region(self, parent: CanonicalRegion, spec: Callable[[Ref], TensorSpec]) -> CanonicalRegion:
        """This step as a canonical region; `spec` gives the layout of each input value."""
        local = {ref: Ref("in", i) for i, ref in enumerate(self.inputs)}
        local.update({Ref("node", j): Ref("node", k) for k, j in enumerate(self.nodes)})
        nodes = tuple(
            CanonicalNode(
                parent.nodes[j].op,
                _rename(parent.nodes[j].args, local),
                {key: _rename(v, local) for key, v in parent.nodes[j].kwargs.items()},
            )
            for j in self.nodes
        )
        outputs = tuple(local[ref] for ref in self.outputs)
        return region_of([spec(ref) for ref in self.inputs], nodes, outputs)


def plan(
    region: CanonicalRegion,
    segmentation: Segmentation,
    names: Callable[[int], Ref | None],
    is_tensor: Callable[[Ref], bool],
) -> list[Step] | None:
    """The region cut into steps along nvFuser's segments, in an order that runs; None
    where the cut cannot be made (see the module docstring) or leaves one step.

    `is_tensor(ref)` says whether a region value is a single tensor (a step's inputs and
    outputs must be)."""
    outputs = region.outputs
    if len(set(outputs)) != len(outputs) or any(ref.kind == "in" for ref in outputs):
        return None  # an output that aliases another value: leave it to one fusion

    def value(name: int) -> Ref | None:
        for _ in range(len(segmentation.copies) + 1):
            found = names(name)
            if found is not None or name not in segmentation.copies:
                return found
            name = segmentation.copies[name]  # a copy nvFuser made: see through it
        return None

    def values(tensors: Sequence[int]) -> list[Ref] | None:
        found = [value(n) for n in tensors]
        return None if None in found else [r for r in found if r is not None]

    wanted: list[tuple[set[Ref], list[Ref]]] = []  # per segment: its stops, its results
    for segment in segmentation.segments:
        ins, outs = values(segment.inputs), values(segment.outputs)
        if ins is None or outs is None:
            return None
        stops = set(ins)
        results = [r for r in dict.fromkeys(outs) if r not in stops]
        if results:  # a segment of copies only (an output alias) has nothing to compute
            wanted.append((stops, results))

    producer: dict[Ref, int] = {}
    for s, (_, results) in enumerate(wanted):
        for ref in results:
            producer.setdefault(ref, s)
    if any(ref not in producer for ref in outputs):
        return None
    steps: list[Step] = []
    for s, (stops, results) in enumerate(wanted):
        mine = [r for r in results if producer[r] == s]
        if not mine:
            continue
        nodes, inputs = _slice(region, mine, stops | {r for r in producer if producer[r] != s})
        if not all(is_tensor(r) for r in (*inputs, *mine)):
            return None
        steps.append(Step(nodes, inputs, tuple(mine)))
    ordered = _order(steps)
    return ordered if ordered is not None and len(ordered) > 1 else None


def _slice(
    region: CanonicalRegion, results: Sequence[Ref], stops: set[Ref]
) -> tuple[tuple[int, ...], tuple[Ref, ...]]:
    """The nodes that compute `results` back to `stops` or region inputs, and the values
    they read from outside (in order of first use)."""
    needed: set[int] = set()
    todo = list(results)
    while todo:
        ref = todo.pop()
        if ref.kind != "node" or ref.index in needed:
            continue
        needed.add(ref.index)
        for arg in region.nodes[ref.index].refs():
            if arg.kind == "node" and arg not in stops:
                todo.append(arg)
    nodes = tuple(sorted(needed))
    inputs: dict[Ref, None] = {}
    for j in nodes:
        for arg in region.nodes[j].refs():
            if arg.kind == "in" or arg.index not in needed:
                inputs.setdefault(arg)
    return nodes, tuple(inputs)


def _order(steps: list[Step]) -> list[Step] | None:
    """Steps in an order where each runs after the steps whose results it reads."""
    made = {ref: i for i, step in enumerate(steps) for ref in step.outputs}
    ordered: list[Step] = []
    state = [0] * len(steps)  # 0 new, 1 in progress, 2 done

    def visit(i: int) -> bool:
        if state[i] == 1:
            return False  # a cycle: the cut does not hold together
        if state[i] == 0:
            state[i] = 1
            for ref in steps[i].inputs:
                if ref.kind == "node" and (ref not in made or not visit(made[ref])):
                    return False
            state[i] = 2
            ordered.append(steps[i])
        return True

    return ordered if all(visit(i) for i in range(len(steps))) else None


def _rename(value: Any, local: Mapping[Ref, Ref]) -> Any:
    if isinstance(value, Ref):
        return local[value]
    if isinstance(value, tuple):
        return tuple(_rename(v, local) for v in value)
    return value
