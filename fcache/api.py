"""fcache's public entry points: `jit`, `stats`, and the torch.compile backend "fcache".

    import fcache
    model = fcache.jit(model)          # forward and backward compiled, region by region
    loss = model(x).sum(); loss.backward()
    print(fcache.stats(model))         # regions, unique regions, hits per tier, compiles

`torch.compile(model, backend="fcache")` works too, registered as a `torch_dynamo_backends`
entry point (fcache.entry, which checks the settings when torch looks it up) so that it
needs no `import fcache`; it takes its settings from FCACHE_* variables. Both routes hand
every captured aten graph to the process's `Session` for those settings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fcache.config import Settings
from fcache.errors import ConfigError, FcacheError
from fcache.stats import ModelStats

if TYPE_CHECKING:
    import torch.fx as fx

    from fcache.engine.backend import WrapperFactory

M = TypeVar("M")
_RECORD = "_fcache_record"


def jit(
    model: M,
    *,
    settings: Settings | None = None,
    server: str | None = None,
    executors: Sequence[str] | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    blocks: bool = False,
) -> M:
    """Compile `model` (an nn.Module or a function) through fcache; returns the compiled one.
    A module's bound method (Hugging Face's `model.forward = fcache.jit(model.forward)`)
    is compiled as its module is, and shares the module's stored functions.

    Compilation happens on the first call, per input signature, as with torch.compile.
    `settings` defaults to `Settings.from_env()`; `server` and `executors` override it.
    `dynamic` is torch.compile's: None (the default) compiles the first shapes statically
    and makes a dimension dynamic once it is seen at a second size (a new sequence length);
    True makes every dimension dynamic at once; False compiles each input shape separately
    (static shapes make the best kernels and the most reusable keys). A graph with symbolic
    sizes is compiled whole by Inductor, its entries kept in fcache's tiers, and a model
    stored whole keeps its dynamic function under a key without the dynamic sizes, so a
    warm process loads it at sizes it never saw (docs/dynamic-shapes.md). Raises
    TypeError, before touching any cache directory, when `model` is not callable.

    A module with a `generate` method (a Hugging Face generative model) gets one on the
    compiled module that runs it with every call of the model compiled here: prefill and
    decode steps, a bounded number of graphs however many tokens (fcache.engine.generate;
    docs/dynamic-shapes.md#generation).

    `blocks=True` compiles only the model's repeated layers (a transformer's), one by one
    and in place, tracing one for all (fcache.engine.blocks): a cold start that does not
    grow with depth, for a slower steady step (the rest of the model runs in eager).
    Returns `model` itself.
    """
    if not callable(model):
        raise TypeError(
            f"fcache.jit compiles an nn.Module or a function, not {type(model).__name__} "
            f"({model!r:.60})"
        )
    torch = _torch()
    if blocks:
        from fcache.engine.blocks import repeated_blocks

        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"fcache.jit(blocks=True) takes an nn.Module, not {type(model).__name__}"
            )
        found = repeated_blocks(model)  # none: an error now, before any cache directory

    from fcache.engine.backend import Backend
    from fcache.engine.compile.session import Session
    from fcache.engine.record import ModelRecord

    settings = settings if settings is not None else Settings.from_env()
    if server is not None:
        settings = settings.replace(server=server)
    if executors is not None:
        settings = settings.replace(executors=tuple(executors))
    if blocks and settings.cuda_graphs:
        raise ConfigError("FCACHE_CUDA_GRAPHS", "1", "0 with fcache.jit(blocks=True)")
    session = Session.get(settings)
    record = ModelRecord()
    # One backend for every block: Dynamo reuses what it traced for one only under the same.
    backend = Backend(session, record, _wrapper(settings))

    def compile_in_place(module: Any) -> Any:
        # What nn.Module.compile() does (the module's _call_impl compiled), with the
        # whole stored function in front: the module keeps its place and names.
        fallback = torch.compile(
            module._call_impl, backend=backend, dynamic=dynamic, fullgraph=fullgraph
        )
        if not settings.whole:
            return fallback
        from fcache.engine.whole import route as whole

        return whole.in_place(module, fallback, backend, dynamic)

    if blocks:
        from fcache.engine.blocks import compile_blocks

        compile_blocks(model, found, compile_in_place)  # type: ignore[arg-type]
        compiled = model
    else:
        compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
        if settings.whole:
            from fcache.engine.whole import route as whole

            compiled = whole.install(compiled, model, backend, dynamic)
        from fcache.engine.generate import Generate, has_generate

        if has_generate(model):
            # `compiled.generate(...)`: the model's generate, its every call compiled here
            # (the wrapper's other attributes are the original module's, uncompiled).
            vars(compiled)["generate"] = Generate(model, compile_in_place)
    setattr(compiled, _RECORD, record)
    return compiled  # type: ignore[no-any-return]


def stats(model: object) -> ModelStats:
    """What compiling `model` (returned by `fcache.jit`) has cost in this process so far."""
    record = getattr(model, _RECORD, None)
    if record is None:
        raise FcacheError(f"{type(model).__name__} was not compiled by fcache.jit")
    return record.snapshot()  # type: ignore[no-any-return]


def backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The entry-point backend: `torch.compile(model, backend="fcache")`."""
    from fcache.engine.backend import Backend
    from fcache.engine.compile.session import Session
    from fcache.engine.record import ModelRecord

    settings = Settings.from_env()
    return Backend(Session.get(settings), ModelRecord(), _wrapper(settings))(gm, example_inputs)


def _wrapper(settings: Settings) -> WrapperFactory | None:
    if not settings.cuda_graphs:
        return None
    from fcache.engine.cudagraphs import CudaGraphs

    return CudaGraphs


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "fcache.jit needs torch: install the build for your machine first "
            "(https://pytorch.org/get-started/), then torch-fcache"
        ) from exc
    return torch
