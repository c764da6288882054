"""Dynamic graphs: a Dynamo graph with symbolic sizes compiled as torch.compile compiles it,
its compiled code kept in fcache's tiers.

Why. fcache's regions are named by their canonical form, which holds every input's exact
shape (fcache.frontend.canonicalize): a region with a symbolic size has none, and ran in
eager. A graph whose sizes went dynamic (torch's automatic dynamic: an input dimension
seen at a second size; or `dynamic=True`) is compiled whole by Inductor instead, the way
`torch.compile(backend="inductor")` compiles it: kernels generic in the symbolic sizes,
behind torch's own guards (Dynamo's on the graph's inputs, Inductor's on the sizes its
kernels assume), so one compile serves every size those guards accept, and a size they
exclude (a length of 1, which Dynamo specializes) is traced and compiled again, never run
through a kernel that excludes it.

Where it is kept. Inductor's two caches (the FX graph cache: Inductor's generated code;
AOTAutogradCache: the forward and backward graphs' entry) keep their entries in
Inductor's cache directory and, for the length of the compile, in their remote tier,
which is routed to the session's TieredCache (local LMDB, fcache-server, Redis) through
fcache.engine.programs.store's backend: signed, checksummed and verified as any fcache
entry. So a process with an empty TORCHINDUCTOR_CACHE_DIR and the same FCACHE_DIR (or the
same server) loads the graph's compiled code instead of compiling it. On CUDA an FX-graph
entry carries its Triton kernels; on a CPU it carries the kernels' C++ source, which
Inductor builds with the host compiler in a process whose Inductor cache directory is
empty (docs/dynamic-shapes.md).

Counted per model (ModelRecord.dynamic_compiled / dynamic_loaded: Dynamo graphs compiled by
Inductor here, or loaded from a cache) and per session (the "dynamic" source of the
session's CacheStats: what `fcache stats` prints).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from unittest import mock

import torch
import torch.fx as fx

from fcache.engine.programs import store as programs
from fcache.stats import DYNAMIC

if TYPE_CHECKING:
    from fcache.engine.compile.session import Session
    from fcache.engine.record import ModelRecord

log = logging.getLogger(__name__)

SOURCE = DYNAMIC  # the session's CacheStats source: hits = loaded, compiles = compiled


def is_symbolic(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether the Dynamo graph has a symbolic input: a SymInt (or SymFloat, SymBool)
    placeholder, or a tensor with a symbolic size, stride or offset."""
    values = list(example_inputs)
    values += [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    return any(_symbolic(v) for v in values)


def _symbolic(value: Any) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        try:
            dims = (*value.shape, *value.stride(), value.storage_offset())
        except RuntimeError:  # a tensor without strides (sparse, nested): sizes only
            dims = tuple(value.shape)
        return any(isinstance(d, torch.SymInt) for d in dims)
    return False


def compile_graph(
    session: Session, record: ModelRecord, gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> Any:
    """Inductor's compile of a Dynamo graph with symbolic sizes (torch.compile's own
    backend), its caches' remote tier the session's tiers; counted in `record`."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    before = _cache_counters(counters)
    start = time.perf_counter()
    with routed(session):
        compiled = compile_fx(gm, example_inputs)
    seconds = time.perf_counter() - start
    after = _cache_counters(counters)
    fx_misses = after[0] - before[0]
    aot_hits = after[2] - before[2]
    loaded = fx_misses == 0 and (aot_hits > 0 or after[1] > before[1])
    with record.lock:
        record.graphs += 1
        if loaded:
            record.dynamic_loaded += 1
            record.load_seconds += seconds
        else:
            record.dynamic_compiled += 1
            record.compile_seconds += seconds
        record.graph_seconds += seconds
    if loaded:
        session.stats.add(SOURCE, hits=1)
    else:
        session.stats.add(SOURCE, misses=1, compiles=1, compile_seconds=seconds)
    log.info(
        "fcache: a graph with symbolic sizes %s by Inductor in %.2fs",
        "loaded" if loaded else "compiled",
        seconds,
    )
    return compiled


def _cache_counters(counters: Any) -> tuple[int, int, int]:
    return (
        counters["inductor"]["fxgraph_cache_miss"],
        counters["inductor"]["fxgraph_cache_hit"],
        counters["aot_autograd"]["autograd_cache_hit"],
    )


@contextlib.contextmanager
def routed(session: Session) -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutogradCache on, their remote tier the session's
    TieredCache (and the backward compiled within the call, so that AOTAutograd's entry is
    complete when it is stored)."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache

    cache = programs.remote_cache(session.cache)
    with (
        torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=True),
        torch._functorch.config.patch(
            enable_autograd_cache=True,
            enable_remote_autograd_cache=True,
            force_non_lazy_backward_lowering=True,
        ),
        mock.patch.object(AOTAutogradCache, "get_remote_cache", staticmethod(lambda: cache)),
        mock.patch.object(FxGraphCache, "get_remote_cache", staticmethod(lambda: cache)),
        programs.pickled_outside_modes(),  # torch 2.11 pickled entries inside the fake mode
    ):
        yield
