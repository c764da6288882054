"""Plan: how one aten graph was cut, so that a warm process can stitch it again without
partitioning or canonicalizing it (fcache.engine.programs.graph keeps one per stored graph).

A plan lists the graph's steps in order, each a node run in eager (its position in the
graph) or a region (the positions of its nodes, its canonical form, its device), plus the
canonical texts its regions share and the fallbacks partitioning counted. It holds no
cache keys: those depend on the executors and their versions, and are worked out afresh
from the canonical forms by every process that uses the plan.

JSON, no pickle; deterministic for one graph and partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.fx as fx

from fcache.frontend.canonicalize import CanonicalRegion, parse
from fcache.frontend.partition import Partition, Region, make_region

VERSION = 1

# A region step: positions of its nodes in the graph, index of its canonical text, device.
RegionStep = tuple[tuple[int, ...], int, str]


class PlanMismatch(Exception):
    """A plan does not fit the graph it is applied to (a different graph, a newer format)."""


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[int | RegionStep, ...]
    canons: tuple[bytes, ...]
    fallbacks: Mapping[str, int]

    @classmethod
    def of(
        cls,
        graph: fx.Graph,
        partition: Partition,
        canonical: Mapping[Region, CanonicalRegion],
        fallbacks: Mapping[str, int],
    ) -> Plan:
        """The plan of a partition; regions missing from `canonical` run their nodes in
        eager, as the stitcher does with them."""
        position = {node: i for i, node in enumerate(graph.nodes)}
        texts: dict[bytes, int] = {}
        steps: list[int | RegionStep] = []
        for step in partition.steps:
            if not isinstance(step, Region):
                steps.append(position[step])
            elif (canon := canonical.get(step)) is None:
                steps.extend(position[n] for n in step.nodes)
            else:
                index = texts.setdefault(canon.text, len(texts))
                nodes = tuple(position[n] for n in step.nodes)
                steps.append((nodes, index, str(step.device)))
        return cls(tuple(steps), tuple(texts), dict(fallbacks))

    def apply(self, graph: fx.Graph) -> tuple[Partition, dict[Region, CanonicalRegion]]:
        """The partition of `graph` this plan describes, and its regions' canonical forms."""
        nodes = list(graph.nodes)
        canons = [parse(text) for text in self.canons]
        steps: list[fx.Node | Region] = []
        canonical: dict[Region, CanonicalRegion] = {}
        try:
            for step in self.steps:
                if isinstance(step, int):
                    steps.append(nodes[step])
                    continue
                positions, index, device = step
                region = make_region(
                    len(canonical), [nodes[i] for i in positions], torch.device(device)
                )
                steps.append(region)
                canonical[region] = canons[index]
        except (IndexError, ValueError, RuntimeError) as exc:
            raise PlanMismatch(f"the plan does not fit the graph: {exc}") from None
        covered = sorted(p for s in self.steps for p in ((s,) if isinstance(s, int) else s[0]))
        if covered != list(range(len(nodes))):
            raise PlanMismatch("the plan does not cover the graph's nodes once each")
        return Partition(tuple(steps)), canonical

    def to_json(self) -> bytes:
        doc = {
            "version": VERSION,
            "steps": [s if isinstance(s, int) else [list(s[0]), s[1], s[2]] for s in self.steps],
            "canons": [t.decode() for t in self.canons],
            "fallbacks": dict(self.fallbacks),
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Plan:
        try:
            doc = json.loads(data)
            if doc.get("version") != VERSION:
                raise PlanMismatch(f"plan version {doc.get('version')!r}")
            steps: list[int | RegionStep] = [
                s if isinstance(s, int) else (tuple(s[0]), int(s[1]), str(s[2]))
                for s in doc["steps"]
            ]
            canons = tuple(t.encode() for t in doc["canons"])
            return cls(tuple(steps), canons, {str(k): int(v) for k, v in doc["fallbacks"].items()})
        except (ValueError, KeyError, TypeError) as exc:
            raise PlanMismatch(f"unreadable plan: {exc}") from None
