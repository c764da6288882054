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

from fcache import process
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
        return _free(value)
    if isinstance(value, torch.Tensor):
        try:
            dims = (*value.shape, *value.stride(), value.storage_offset())
        except RuntimeError:  # a tensor without strides (sparse, nested): sizes only
            dims = tuple(value.shape)
        return any(isinstance(d, torch.SymInt) and _free(d) for d in dims)
    return False


def _free(value: Any) -> bool:
    """Whether a symbolic value can still take more than one value. A size that went
    dynamic (seen at a second size) and that the trace then pinned to one value is not:
    generation's attention mask is one longer each step, but at the first decode step the
    cache is still at its first length, and the mask's size must equal the cache's plus
    one (transformers' masking_utils guards it), so Dynamo replaces the symbol by the
    constant (`set_replacement s16 = 17 (range_refined_to_singleton)`). Such a graph is
    static: regions, not Inductor's dynamic compile."""
    try:
        return value.node.maybe_as_int() is None if isinstance(value, torch.SymInt) else True
    except Exception:  # a node without a shape environment: take it as symbolic
        return True


def compile_graph(
    session: Session, record: ModelRecord, gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> Any:
    """Inductor's compile of a Dynamo graph with symbolic sizes (torch.compile's own
    backend), its caches' remote tier the session's tiers; counted in `record`."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx

    process.shared("dynamic.bounds_checked_in_order", bounds_checked_in_order)
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


def bounds_checked_in_order() -> bool:
    """torch 2.11's C++ codegen puts an index's bounds check among a kernel's loads even
    where the index was already computed among its operations (`CppKernel.check_bounds`):
    the check names a variable declared after it, and g++ refuses the kernel ("'tmp2' was
    not declared in this scope"). Inductor asks for such checks where it cannot prove an
    index in range, which symbolic sizes make common: the causal mask of a Hugging Face
    decoder whose cache length is symbolic (generation with a DynamicCache on a CPU) failed
    to build, under torch.compile as here. torch 2.13 checks among the operations then;
    this installs the same rule on releases without it (once per process, through
    fcache.process.shared). True where it installed it."""
    import inspect

    try:  # the names 2.13's rule uses; a torch without them keeps its own
        from torch._inductor.codegen import cpp
        from torch._inductor.codegen.common import free_symbol_is_type
        from torch._inductor.codegen.cpp_utils import cexpr
        from torch._inductor.utils import SymT
        from torch._inductor.virtualized import V, ops
    except ImportError:
        return False
    kernel = cpp.CppKernel
    try:
        source = inspect.getsource(kernel.check_bounds)
    except (OSError, TypeError):
        return False
    if "try_get" in source or "contains(" in source:  # torch's own fix is there
        return False

    def check_bounds(
        self: Any, expr: Any, size: Any, lower: bool, upper: bool
    ) -> None:  # torch 2.13's CppKernel.check_bounds
        if not (lower or upper):
            return
        if free_symbol_is_type(expr, SymT.TMP) or self.cse.contains(
            cexpr(self.rename_indexing(expr))
        ):
            csevar = ops.index_expr(expr, torch.int64).value
            buffer = V.kernel.compute
        else:
            prior_compute = V.kernel.compute
            try:
                V.kernel.compute = self.loads
                csevar = ops.index_expr(expr, torch.int64).value
            finally:
                V.kernel.compute = prior_compute
            buffer = self.loads
        size_str = V.kernel.sexpr(self.rename_indexing(size)) if upper else None
        line = self.indirect_assert(csevar, "0" if lower else None, size_str, self._load_mask)
        self.cse.generate(buffer, line, assignment=False)

    kernel.check_bounds = check_bounds  # type: ignore[method-assign]
    return True


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
