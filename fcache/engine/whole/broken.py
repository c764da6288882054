"""The whole route's side of a graph-broken function: its CompilePackage
(fcache.engine.whole.packaged) made at a cold first call and stored under the function's
key, or loaded from it in a warm process; where Dynamo's package bookkeeping fails, the
call and every later one take torch.compile's route, and a marker says so to later
processes (as for any function not stored whole).

One package per `Whole` and process: a second input signature is traced by Dynamo into
the same package (its frames' guards tell the signatures apart)."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fcache.engine.programs import store as programs
from fcache.engine.whole import contexts, packaged, serializable

if TYPE_CHECKING:
    from fcache.cache.artifact import Artifact
    from fcache.engine.whole.route import Whole

log = logging.getLogger(__name__)


class Broken:
    """The package of one `Whole`'s target: `fn` once made or loaded."""

    def __init__(self, whole: Whole) -> None:
        self._whole = whole
        self.fn: packaged.Packaged | None = None

    def load(
        self, key: str, entry: Artifact, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> packaged.Packaged | None:
        """The stored package installed; None (compiled afresh) where it cannot be, or
        its guards reject these inputs."""
        from fcache.engine.programs import graph as program

        if self.fn is not None:  # one package per function and process
            return None
        whole, start = self._whole, time.perf_counter()
        backend = whole.backend
        token = program.building.set(
            program.Building(backend.session, backend.record, 0, backend.new_wrapper())
        )
        fn = None
        try:
            with contexts.collector_paused(), contexts.parametrized_by_path(whole.model):
                fn = packaged.load(
                    entry.payload, whole.target, serializable.Serializable(backend),
                    whole.dynamic, self._guards(),
                )  # fmt: skip
            if not fn.guard_check(*args, **kwargs):
                log.info("fcache: stored package's guards reject these inputs; compiling")
                fn.forget()  # its globals out: a compile afresh takes the same names
                return None
        except Exception as exc:  # a changed source, a foreign torch: compile afresh
            if fn is not None:
                fn.forget()
            log.warning(
                "fcache: stored package %s not loaded (%s); compiling",
                key, first_line(exc), exc_info=log.isEnabledFor(logging.DEBUG),
            )  # fmt: skip
            return None
        finally:
            program.building.reset(token)
        loaded = fn

        def failed(args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> Any:
            # Dynamo's package bookkeeping failed on a frame this process traces anew:
            # the package out, torch.compile's route from now on, here and (the marker
            # replaces the package) in later processes.
            log.warning("fcache: stored package %s failed (%s); taking torch.compile's route",
                        key, first_line(exc))  # fmt: skip
            loaded.forget()
            self.fn = None
            whole.decline([key], first_line(exc), (args, kwargs), drop=loaded)
            return whole.fallback(args, kwargs)

        fn.on_failure(failed)
        self.fn = fn
        with backend.record.lock:
            backend.record.functions_loaded += 1
        log.debug("fcache: stored package loaded in %.3fs", time.perf_counter() - start)
        return fn

    def new(self, keys: list[str], exc: BaseException) -> packaged.Packaged | None:
        """A function aot_compile refused with `exc`, run through Dynamo with a
        CompilePackage and stored under the first of `keys` after its first call; None
        where `exc` is no graph break, torch has no package, or this function has one."""
        if not keys or self.fn is not None or not graph_break(exc) or not packaged.supported():
            return None
        whole = self._whole
        key = keys[0]

        def store(fn: packaged.Packaged, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                with programs.pickled_outside_modes():
                    data = fn.serialize()
            except Exception as exc:
                # Later calls (any signature) take torch.compile's route, as a warm
                # process will at once. Traced again, not served by the package's frames:
                # their programs are keyed under the package's settings, and a warm
                # process's route would find none of them (OPT on torch 2.11: 14 graphs
                # traced in the cold process instead of 7, and the warm one loads 7).
                log.info("fcache: graph-broken function not stored (%s)", first_line(exc))
                whole.decline(keys, first_line(exc), (args, kwargs), drop=fn)
                fn.stop_storing()
                self.fn = None
                return
            whole.store(key, data, fn.seconds, **{packaged.PACKAGED: "1"})

        def cold(args: tuple[Any, ...], kwargs: dict[str, Any], exc: BaseException) -> Any:
            # Dynamo failed where torch.compile's route may not (a guard it could not
            # serialize fails torch 2.13's package build): that route, now and later.
            log.warning("fcache: graph-broken function not stored (%s)", first_line(exc))
            whole.decline(keys, first_line(exc), (args, kwargs), drop=fn)
            self.fn = None
            return whole.fallback(args, kwargs)

        def context() -> Any:
            stack = contextlib.ExitStack()
            stack.enter_context(programs.pickled_outside_modes())
            stack.enter_context(contexts.sources_rebuildable())  # guards pickled as built
            stack.enter_context(contexts.parametrized_by_path(whole.model))
            stack.enter_context(contexts.grads_hidden(whole.model))
            stack.enter_context(contexts.own_attributes_hidden(whole.model, whole))
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor")
            return stack

        log.info("fcache: not captured whole (%s); storing Dynamo's package of its frames",
                 first_line(exc))  # fmt: skip
        fn = packaged.new(
            whole.target, serializable.Serializable(whole.backend), whole.dynamic,
            self._guards(), store, cold, context,
        )  # fmt: skip
        self.fn = fn
        return fn

    def _guards(self) -> Callable[..., Any]:
        target = self._whole.target
        return functools.partial(serializable.storable_guards, serializable.freevars(target))


def graph_break(exc: BaseException) -> bool:
    """Whether aot_compile refused a function for a graph break, which a CompilePackage
    can store frame by frame: Dynamo's Unsupported, or a data-dependent value it could not
    trace through (a loop over `nonzero()`, a branch on `.item()`: under fullgraph=True a
    UserError caused by GuardOnDataDependentSymNode or a fake tensor's data-dependent
    exception, where torch.compile's route breaks the graph there)."""
    from torch._dynamo import exc as dynamo_exc
    from torch._subclasses import fake_tensor
    from torch.fx.experimental import symbolic_shapes

    kinds = (
        dynamo_exc.Unsupported,
        symbolic_shapes.GuardOnDataDependentSymNode,
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
    )
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
