"""Stitched graphs with unchecked regions against the same graphs with checked ones, in one
process, calls alternating: what skipping Inductor's per-call size asserts saves per graph
call, apart from the noise between processes.

    python -m bench.unchecked_ab --device cpu --family llama --layers 8 --repeats 200

It compiles (or loads) the model with fcache, records each stitched graph fcache builds and
one call's inputs, then times, under no_grad, each graph as fcache runs it (regions
unchecked from the second call) against the same graph with every region's unchecked
variant removed (regions checking their inputs at every call), alternating, and prints
the median host time per call of each, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

import fcache
from fcache.engine.compile import session
from fcache.examples.models import ModelConfig, build, sample_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--family", default="llama")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    made: list[tuple[Any, Any, Any, Any]] = []  # (partition, compiled regions, owner, returned)
    inputs: dict[int, list[Any]] = {}  # one call's inputs per graph, once `keeping`
    keeping = False
    stitch = session.stitch

    def recording(partition: Any, compiled: Any, owner: Any, returned: Any = ()) -> Any:
        fn, k = stitch(partition, compiled, owner, returned), len(made)
        made.append((partition, dict(compiled), owner, returned))

        def graph(args_: list[Any]) -> Any:
            if keeping and k not in inputs:
                inputs[k] = list(args_)  # the call clears the list it gets
            return fn(args_)

        graph._boxed_call = True  # type: ignore[attr-defined]
        return graph

    session.stitch = recording  # type: ignore[assignment]
    device = torch.device(args.device)
    cfg = ModelConfig(family=args.family, layers=args.layers)
    model = build(cfg).to(device)
    tokens = sample_tokens(cfg, 2, 64).to(device)
    compiled_model = fcache.jit(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        compiled_model(tokens).float().pow(2).mean().backward()

    for _ in range(3):
        step()
    keeping = True
    step()
    results = []
    for k, (partition, compiled, owner, returned) in enumerate(made):
        if k not in inputs:
            continue
        lean = stitch(partition, compiled, owner, returned)
        asserting = {r: _checked(f) for r, f in compiled.items()}
        checked = stitch(partition, asserting, owner, returned)
        times: dict[str, list[float]] = {"unchecked": [], "checked": []}
        with torch.no_grad():
            for fn in (lean, checked, lean, checked):  # first and second calls: not timed
                fn(list(inputs[k]))
            for _ in range(args.repeats):
                for name, fn in (("unchecked", lean), ("checked", checked)):
                    start = time.perf_counter()
                    fn(list(inputs[k]))
                    times[name].append(time.perf_counter() - start)
        results.append({
            "graph": k,
            "regions": len(partition.regions),
            "unchecked_us": round(statistics.median(times["unchecked"]) * 1e6, 1),
            "checked_us": round(statistics.median(times["checked"]) * 1e6, 1),
        })  # fmt: skip
    print(json.dumps({"device": args.device, "family": args.family, "layers": args.layers,
                      "torch": torch.__version__, "graphs": results}, indent=1))  # fmt: skip


def _checked(fn: Any) -> Any:
    def region(inputs: list[Any]) -> Any:
        return fn(inputs)

    return region


if __name__ == "__main__":
    main()
