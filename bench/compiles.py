"""What a measured process has compiled so far (bench.varlen, bench.generate): torch's
counters of Dynamo graphs and of Inductor's FX-graph cache, and, for a model under fcache,
its record (regions compiled, dynamic graphs, programs and whole functions loaded)."""

from __future__ import annotations

from typing import Any


def so_far(fcache_model: Any = None) -> dict[str, int]:
    """Counts since the process started; `fcache_model`: the model fcache.jit returned."""
    from torch._dynamo.utils import counters

    found = {
        "dynamo_graphs": counters["stats"]["unique_graphs"],
        "fx_graph_misses": counters["inductor"]["fxgraph_cache_miss"],
        "fx_graph_hits": counters["inductor"]["fxgraph_cache_hit"],
    }
    if fcache_model is not None:
        import fcache

        stats = fcache.stats(fcache_model)
        found.update(
            graphs=stats.graphs,
            region_compiles=stats.compiles,
            dynamic_compiled=stats.dynamic_compiled,
            dynamic_loaded=stats.dynamic_loaded,
            programs_loaded=stats.programs_loaded,
            functions_loaded=stats.functions_loaded,
        )
    return found
