"""CUDA-graph decisions that need no GPU (fcache.engine.cudagraphs): a graph that writes to
an input is replayed only if that input is static (read in place), and a backward that
cannot be captured still runs, whether or not its forward's CUDA-graph tree exists yet
(it does not when the backward is compiled: trees are made at the forward's first call).
The replays themselves: tests/gpu/test_cudagraphs.py."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.cudagraph_utils import get_placeholder_info
from torch.fx.experimental.proxy_tensor import make_fx

from fcache.engine import cudagraphs
from fcache.engine.cudagraphs import CudaGraphs, InputRoles


def _step(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    b.add_(1)  # a buffer updated in place, as BatchNorm's statistics are
    return x @ w + b


def _graph() -> torch.fx.GraphModule:
    return make_fx(_step)(torch.randn(4, 4), torch.randn(4), torch.randn(2, 4))


def test_a_written_input_is_replayable_only_when_static() -> None:
    placeholders = get_placeholder_info(_graph().graph)
    assert cudagraphs._mutated(placeholders, InputRoles(static=(0, 1), mutated=(1,))) is None
    why = cudagraphs._mutated(placeholders, InputRoles(static=(0,), mutated=(1,)))
    assert why is not None and "mutated inputs" in why


def test_roles_from_the_graph_alone_see_its_writes() -> None:
    roles = cudagraphs.fallback_roles("forward", _graph())
    assert roles == InputRoles(static=(), mutated=(1,))


class _Tree:
    """Stands in for torch's CUDA-graph tree of the forward (a real one needs a GPU)."""

    def __init__(self) -> None:
        self.backwards = 0

    def set_to_running_backward(self) -> None:
        self.backwards += 1


def test_a_backward_that_cannot_be_captured_tells_the_tree_made_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch._inductor import cudagraph_trees

    trees: dict[int, _Tree] = {}
    monkeypatch.setattr(
        cudagraph_trees, "get_manager", lambda index, create_if_none_exists=True: trees.get(index)
    )
    gm = _graph()  # on the CPU: never captured
    calls = []

    def compiled(args: list[torch.Tensor]) -> list[torch.Tensor]:
        calls.append(len(args))
        return [gm(*args)]

    graphs = CudaGraphs()
    wrapped = graphs("backward", gm, compiled, InputRoles(static=(0, 1, 2), mutated=(1,)))
    args = [torch.eye(4), torch.zeros(4), torch.ones(2, 4)]
    (out,) = wrapped(list(args))  # no tree yet: it just runs
    torch.testing.assert_close(out, torch.ones(2, 4) + 1)
    trees[0] = _Tree()  # the forward's first call made its tree
    wrapped(list(args))
    assert calls == [3, 3] and trees[0].backwards == 1
    # A forward on the CPU is left alone, and its backward then too.
    assert graphs("forward", gm, compiled, InputRoles()) is compiled
    assert graphs("backward", gm, compiled, InputRoles()) is compiled
