"""Backend: the torch.compile backend of one model compiled through fcache.

Per Dynamo graph it gives attention calls with a constant causal mask SDPA's causal
kernel (fcache.frontend.causal), then runs fcache's capture (AOTAutograd with Inductor's
decompositions, fcache.frontend.capture) with graph compilers that return `ProgramGraph`s
(fcache.engine.programs.graph), under three torch settings that let AOTAutogradCache keep them:

- `bundled_autograd_cache`: the entry holds the compiled graphs themselves, not keys into
  Inductor's FX graph cache;
- `force_non_lazy_backward_lowering`: the backward graph is compiled within this call, not
  at the first backward, so the entry is complete when it is saved;
- `cache_key_tag`: fcache's capture version and its way of cutting graphs salt the key, so
  that fcache's entries and Inductor's for the same Dynamo graph never answer for each
  other.

A warm process then finds the entry, skips AOTAutograd's tracing and fcache's partitioning,
and only looks its regions up (the key is computed without its avoidable costs:
fcache.engine.programs.key). Entries are kept in Inductor's cache directory and, through
AOTAutogradCache's remote cache, in fcache's own tiers (fcache.engine.programs.store), so a
process that finds the regions finds the programs too. The settings are patched for the
length of the call only.

A Dynamo graph with symbolic sizes (a dimension gone dynamic) has no canonical form: it
is compiled as torch.compile compiles it, by Inductor, with Inductor's caches kept in
fcache's tiers (fcache.engine.dynamic).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from fcache.engine import dynamic
from fcache.engine.compile.session import Session
from fcache.engine.programs import graph as program
from fcache.engine.programs import key as program_key
from fcache.engine.programs import store as programs
from fcache.engine.record import ModelRecord
from fcache.frontend import capture, causal

# Wrapper of one Dynamo graph's compiled graphs (CUDA graphs), made per Dynamo graph and
# per whole stored function loaded.
WrapperFactory = Callable[[], program.Wrapper]


class Backend:
    """A torch.compile backend: `torch.compile(model, backend=Backend(session, record))`."""

    compiler_name = "fcache"

    def __init__(
        self, session: Session, record: ModelRecord, wrap: WrapperFactory | None = None
    ) -> None:
        self.session = session
        self.record = record
        self._wrap = wrap
        self._count = itertools.count(1)
        # Whole stored functions by target (fcache.engine.whole.route), shared by the modules
        # compiled with this backend.
        self.whole_functions: dict[Any, list[Any]] = {}
        # Input dimensions gone dynamic, and the input shapes seen, by the key of an input
        # signature without sizes (fcache.engine.whole.dims.keys).
        self.whole_dims: dict[str, frozenset[tuple[str, int]]] = {}
        self.whole_shapes: dict[str, list[dict[str, tuple[int, ...]]]] = {}

    @functools.cached_property
    def compiler_fn(self) -> Any:
        """AOTAutograd with fcache's graph compilers; the attribute torch's aot_compile
        looks for to serialize a whole compiled function. Made at the first trace: a warm
        process that loads whole functions never imports the tracing machinery (about a
        second of imports on a GPU host)."""
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
        from torch._inductor.output_code import OutputCode

        def compiler(kind: str) -> Any:
            def compile_one(gm: fx.GraphModule, inputs: Sequence[Any]) -> program.ProgramGraph:
                return program.ProgramGraph.compile(kind, gm, inputs)

            # Only compilers of this type have their results kept by AOTAutogradCache.
            return SerializableAOTDispatchCompiler(OutputCode, compile_one)

        return capture.aot(compiler("forward"), compiler("backward"), compiler("inference"))

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        if dynamic.is_symbolic(gm, example_inputs):
            # Sizes with no canonical form: Inductor's own compile, kept in fcache's tiers.
            return dynamic.compile_graph(self.session, self.record, gm, example_inputs)
        causal.restore_is_causal(gm)  # before AOTAutograd: the backward gets the causal kernel too
        wrapper = self.new_wrapper()
        device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor)), None)
        token = program.building.set(
            program.Building(self.session, self.record, next(self._count), wrapper)
        )
        # DDP's graph splitter asks AOTAutograd for fake outputs at the first call, which
        # AOTAutogradCache refuses to store ("Won't cache a graph with fakify_first_call
        # enabled": a warm DDP job traced every bucket again). fcache's programs answer a
        # call on fake tensors themselves (ProgramGraph._on_fakes).
        tracing = torch._guards.TracingContext.try_get()
        fakify = tracing is not None and tracing.fakify_first_call and _loaded_meta_set()
        if fakify:
            tracing.fakify_first_call = False  # type: ignore[union-attr]
        try:
            with (
                torch._functorch.config.patch(
                    enable_autograd_cache=True,
                    bundled_autograd_cache=True,
                    force_non_lazy_backward_lowering=True,
                ),
                torch.compiler.config.patch(cache_key_tag=self.cache_key_tag(example_inputs)),
                torch._functorch.config.patch(enable_remote_autograd_cache=True),
                program_key.fast_keys(),
                # No stored program: start the compile workers while AOTAutograd traces.
                programs.routed(self.session, functools.partial(self.prestart, device)),
            ):
                return self.compiler_fn(gm, example_inputs)
        finally:
            program.building.reset(token)
            if fakify:
                tracing.fakify_first_call = True  # type: ignore[union-attr]

    def cache_key_tag(self, example_inputs: Sequence[Any]) -> str:
        """What salts torch's key of a stored program: fcache's capture version and how its
        graphs are cut, by layer or by op (a plan made one way does not serve the other).
        That is the setting and the first executor on the inputs' device (nvFuser first:
        by op), not the setting alone."""
        cut = "layers" if self.session.by_layer(example_inputs) else "ops"
        return f"{capture.CAPTURE_VERSION}:regions={cut}"

    def new_wrapper(self) -> program.Wrapper | None:
        """The wrapper of one more Dynamo graph's compiled graphs (CUDA graphs), if any."""
        return self._wrap() if self._wrap is not None else None

    def prestart(self, device: torch.device | None) -> None:
        """A cold start is under way on `device`: start the compile workers (GPUs only;
        once per session, fcache.engine.compile.session.Session.prestart)."""
        if device is not None:
            self.session.prestart(device)


@functools.cache
def _loaded_meta_set() -> bool:
    """Whether a graph AOTAutogradCache loads sets the tracing context's forward metadata,
    as a compiled one does (DDP's graph splitter reads it for each bucket): torch does not,
    so AOTAutograd's result class is made to, where this torch has the names it patches
    (torch 2.13's). False: DDP's buckets keep torch's fake first call and are not stored."""
    try:
        from torch._functorch._aot_autograd import graph_compile
        from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult
    except ImportError:
        return False
    inner = getattr(graph_compile, "_get_inner_meta", None)
    original = getattr(GenericAOTAutogradResult, "wrap_post_compile", None)
    if inner is None or original is None:
        return False

    def wrap_post_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (context := torch._guards.TracingContext.try_get()) is not None:
            context.fw_metadata = inner(self.maybe_subclass_meta, self.runtime_metadata)
        return original(self, *args, **kwargs)

    GenericAOTAutogradResult.wrap_post_compile = wrap_post_compile  # type: ignore[method-assign]
    return True
