"""Programs: fcache's compiled aten graphs in a form torch's AOTAutograd cache can keep, so
that a warm process skips AOTAutograd's tracing and fcache's partitioning.

torch.compile's own warm start skips AOTAutograd through AOTAutogradCache, keyed by the
Dynamo graph (its code, input metadata, grad and autocast state, configs, torch version);
the cache only stores results of compilers that return an `OutputCode`. A `ProgramGraph`
is one: it holds the aten graph as text and the plan of its cut (fcache.frontend.graph_text,
fcache.engine.programs.plan), JSON both, and the live stitched callable, which is dropped before
torch pickles the entry. On a hit, torch unpickles the entry, rebuilds AOTAutograd's
runtime wrappers from its stored metadata and calls `post_compile`: fcache then stitches
the graph from the plan, each region a look-up in its own cache tiers (no partitioning, no
canonicalization). A changed model has another Dynamo graph: the program misses,
AOTAutograd runs, and the regions that did not change still hit.

The entry lives in torch's own cache directory (TORCHINDUCTOR_CACHE_DIR/aotautograd) and is
a torch pickle, trusted as torch trusts it; it holds no kernel, only the graph and plan.
`post_compile` needs to know which session and model it rebuilds for: the backend call
in progress says so through `building` (a context variable, set by fcache.engine.backend).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.fx as fx
from torch._inductor.output_code import OutputCode

from fcache.engine import cudagraphs
from fcache.engine.programs.plan import Plan, PlanMismatch
from fcache.frontend import constants, graph_text

if TYPE_CHECKING:
    from fcache.engine.compile.session import Session
    from fcache.engine.record import ModelRecord

log = logging.getLogger(__name__)

Boxed = Callable[[list[Any]], Any]
# (kind, aten graph, compiled, its inputs' roles) -> callable: CUDA graphs.
Wrapper = Callable[[str, fx.GraphModule, Boxed, cudagraphs.InputRoles], Boxed]


@dataclass
class Building:
    """What the Dynamo graph being compiled is compiled for: the session, the model's
    record, the graph's number in the model (for labels) and its wrapper."""

    session: Session
    record: ModelRecord
    number: int
    wrapper: Wrapper | None

    def finish(
        self, kind: str, gm: fx.GraphModule, fn: Boxed, roles: cudagraphs.InputRoles | None
    ) -> Boxed:
        if self.wrapper is None:
            return fn
        return self.wrapper(kind, gm, fn, roles or cudagraphs.fallback_roles(kind, gm))


# The backend call in progress (fcache.engine.backend sets it around AOTAutograd).
building: contextvars.ContextVar[Building | None] = contextvars.ContextVar(
    "fcache_building", default=None
)


class ProgramGraph(OutputCode):
    """One compiled aten graph, storable by AOTAutogradCache (see the module docstring).
    Calls are boxed: `fn(inputs: list)`."""

    def __init__(
        self,
        kind: str,
        text: bytes | None,
        plan: bytes,
        why_not: str = "",
        input_roles: cudagraphs.InputRoles | None = None,
        returned: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        # An instance attribute: torch's wrappers copy __dict__ (functools.wraps), and
        # AOTAutograd calls a compiled graph with a list only when it finds this flag.
        self._boxed_call = True
        self.kind = kind
        self.text = text  # None: the graph has no text form; the entry is bypassed
        self.plan = plan
        self.why_not = why_not
        # Which inputs keep their address from call to call and which the graph writes
        # to, as AOTAutograd knew them while compiling: a warm process's CUDA graphs
        # replay by them (fcache.engine.cudagraphs).
        self.input_roles = input_roles
        # Output positions whose values go to the model's caller as they are
        # (`returned_outputs`): a padded matmul's product keeps its padded rows there.
        self.returned = returned
        self.fn: Boxed | None = None

    @classmethod
    def compile(cls, kind: str, gm: fx.GraphModule, inputs: Sequence[Any]) -> ProgramGraph:
        """Compile an aten graph for the backend call in progress (a cold start)."""
        now = _current()
        label = f"{kind} {now.number}"
        constants.inline_small(gm)  # before anything reads the graph: regions compute them
        static = _from_metadata(kind, lambda m: tuple(m.static_input_indices), ())
        roles = cudagraphs.input_roles(kind, gm, static)  # before anything else reads gm
        returned = returned_outputs(kind)
        # No graph waits for its regions here (where there are compile workers: see
        # Session.compile_graph); its callable waits at its first call. A
        # forward's regions compile while AOTAutograd goes on to the backward (it lowers
        # the backward in the same call); a backward's while Dynamo finishes, the forward
        # runs and the graphs after a graph break (a model's loss) are captured.
        stitched = now.session.compile_graph(
            gm.graph, gm, inputs, label, record=now.record, wait=False, returned=returned
        )
        try:
            text, why_not = graph_text.dumps(gm), ""
        except graph_text.NotSerializable as exc:
            text, why_not = None, str(exc)
        if text is not None and (unstorable := _aliased_outputs(kind)):
            text, why_not = None, unstorable
        program = cls(kind, text, stitched.plan.to_json(), why_not, roles, returned)
        program.fn = now.finish(kind, gm, stitched.fn, roles)
        program.__dict__["_module"] = gm  # `_on_fakes`'s graph
        return program

    def __call__(self, inputs: Sequence[Any]) -> Any:
        if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
            return self._on_fakes(inputs)
        assert self.fn is not None, "a ProgramGraph is called after post_compile"
        return self.fn(inputs)  # type: ignore[arg-type]

    def _on_fakes(self, inputs: Sequence[Any]) -> Any:
        """The graph run eagerly under the fake mode in effect. DDP's graph splitter
        (Dynamo's DDPOptimizer) calls each bucket's compiled graph once on fake tensors to
        learn the outputs the next bucket is compiled for; torch's own answer to that,
        `fakify_first_call`, keeps AOTAutogradCache from storing the graph (see
        fcache.engine.backend). fcache's outputs keep the traced layouts, so the eager
        graph's fake outputs are the compiled graph's."""
        module = self.__dict__.get("_module")
        if module is None:
            assert self.text is not None, "a graph without text is called after compile"
            graph = graph_text.loads(self.text)
            module = fx.GraphModule(graph_text.owner(graph), graph)
            self.__dict__["_module"] = module
        return list(module(*inputs))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["fn"] = None  # the stitched callable holds loaded kernels: rebuilt, never pickled
        state.pop("_module", None)  # the eager graph of `_on_fakes`: rebuilt from the text
        return state

    def prepare_for_serialization(self) -> None:
        if self.text is None:
            from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

            raise BypassAOTAutogradCache(f"fcache: graph not storable: {self.why_not}")

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, kwargs: Any) -> None:
        """Rebuild the callable of a stored program (a warm start); nothing if it has one."""
        if self.fn is not None:
            return
        now = _current()
        start = time.perf_counter()
        assert self.text is not None
        graph = graph_text.loads(self.text)
        owner = graph_text.owner(graph)  # the constants its get_attr nodes read
        label = f"{self.kind} {now.number} (stored program)"
        returned = getattr(self, "returned", ())  # () in a program stored before it
        try:
            stitched = now.session.compile_graph(
                graph, owner, example_inputs, label, record=now.record,
                plan=Plan.from_json(self.plan), returned=returned,
            )  # fmt: skip
        except PlanMismatch as exc:  # a damaged or foreign entry: cut the graph afresh
            log.warning("fcache: a stored program's plan is unusable (%s); cutting again", exc)
            graph_text.with_values(graph)
            stitched = now.session.compile_graph(
                graph, owner, example_inputs, label, record=now.record, returned=returned
            )
        fn = stitched.fn
        if now.wrapper is not None:
            # CUDA-graph checks read a GraphModule, its nodes' devices and ops; made
            # only for them (generating its code costs a fifth of a rebuild).
            graph_text.with_values(graph)
            gm = fx.GraphModule(owner, graph)
            fn = now.finish(self.kind, gm, fn, getattr(self, "input_roles", None))
        self.fn = fn
        with now.record.lock:
            now.record.programs_loaded += 1
        log.debug("fcache: %s rebuilt in %.3fs", label, time.perf_counter() - start)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # fcache's kernels live in its own cache, not in torch's entry


def returned_outputs(kind: str) -> tuple[int, ...]:
    """Positions in the output of the `kind` graph AOTAutograd is compiling whose values
    it hands to the model's caller as they are: the forward's (or inference graph's) own
    results, after its effect tokens (an effectful op's, such as linalg's error checks) and
    the new values of mutated inputs, before what the forward saves for the backward; not
    outputs AOTAutograd rebuilds as views of an input or of another output. () for a
    backward, or where AOTAutograd's metadata does not say."""
    from torch._functorch._aot_autograd.schemas import OutputType

    def read(metadata: Any) -> tuple[int, ...]:
        start = len(metadata.tokens) + metadata.num_mutated_inp_runtime_indices
        return tuple(
            start + i
            for i, info in enumerate(metadata.output_info)
            if info.output_type == OutputType.non_alias
        )

    return _from_metadata(kind, read, ())


def _aliased_outputs(kind: str) -> str:
    """Why a graph's compiled function must not be stored, if it must not: it returns a
    view of another of its outputs (`return y, y.view(-1, n)`), and AOTAutograd rebuilds
    such an output from a stored entry with garbage sizes (torch 2.13: a warm
    torch.compile process fails the same way). Such a model traces again in a warm
    process (its regions still come from the cache)."""
    from torch._functorch._aot_autograd.schemas import OutputType

    def read(metadata: Any) -> str:
        aliased = OutputType.alias_of_intermediate_base_is_user_output
        if any(info.output_type == aliased for info in metadata.output_info):
            return "an output is a view of another output (torch rebuilds it wrongly when stored)"
        return ""

    return _from_metadata(kind, read, "")


T = TypeVar("T")


def _from_metadata(kind: str, read: Callable[[Any], T], default: T) -> T:
    """`read` of AOTAutograd's metadata of the forward or inference graph it is compiling;
    `default` for a backward, or where the metadata is missing or not as `read` expects
    (what is read here tunes layouts and storing: never a reason for a compile to fail)."""
    import torch._guards

    if kind == "backward":
        return default
    try:
        context = torch._guards.TracingContext.try_get()
        metadata = context.fw_metadata if context is not None else None
        return default if metadata is None else read(metadata)
    except Exception as exc:
        log.debug("fcache: AOTAutograd's metadata of a %s graph not read: %s", kind, exc)
        return default


def _current() -> Building:
    now = building.get()
    if now is None:
        # Loaded outside fcache's backend (torch's own precompile loader, say): the
        # process's session for the environment's settings, and a record of its own.
        from fcache.config import Settings
        from fcache.engine.compile.session import Session
        from fcache.engine.record import ModelRecord

        now = Building(Session.get(Settings.from_env()), ModelRecord(), 0, None)
    return now
