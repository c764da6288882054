"""Contexts entered only around the frames Dynamo compiles
(fcache.engine.whole.contexts.around_compiles): a cold packaged function's later calls pay
for its recording contexts only when they compile."""

from __future__ import annotations

import contextlib

import torch

from fcache.engine.whole import contexts


def test_contexts_are_entered_around_each_compile_and_nowhere_else() -> None:
    events: list[str] = []

    @contextlib.contextmanager
    def recording() -> object:
        events.append("enter")
        try:
            yield
        finally:
            events.append("exit")

    def factory() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(recording())
        return stack

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        events.append("compiled")  # within Dynamo's compile of the frame
        return gm.forward

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, dynamic=False)
    with contexts.around_compiles(factory):
        compiled(torch.ones(3))  # compiles: inside the contexts
        compiled(torch.ones(3))  # cached: no contexts
        compiled(torch.ones(4))  # a new size: compiles again
    assert events == ["enter", "compiled", "exit", "enter", "compiled", "exit"]
    events.clear()
    compiled(torch.ones(5))  # outside: a compile, and no contexts
    assert events == ["compiled"]
    torch._dynamo.reset()
