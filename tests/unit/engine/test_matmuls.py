"""Padded matmuls (fcache.engine.rewrite.matmuls): the same product, and padding only where the
trace says a large 16-bit CUDA matmul has a misaligned dimension."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.fx as fx

from fcache.engine.rewrite.matmuls import pad2d, pad_matmuls, unpadded_addmm, unpadded_mm

aten = torch.ops.aten


@pytest.mark.parametrize("pads", [(0, 0, 3), (5, 0, 0), (0, 7, 0), (1, 2, 3)])
def test_padded_products_equal_the_unpadded_ones(pads: tuple[int, int, int]) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(13, 21), torch.randn(21, 9)
    pm, pk, pn = pads
    a_p, b_p = pad2d(a, pm, pk), pad2d(b, pk, pn)
    got = unpadded_mm(a_p, b_p, pm, pn)
    assert got.shape == (13, 9) and got.is_contiguous()
    torch.testing.assert_close(got, a @ b)
    # transposed operands, as a backward's matmuls have them
    got_t = unpadded_mm(pad2d(b.t(), pn, pk), pad2d(a.t(), pk, pm), pn, pm)
    torch.testing.assert_close(got_t, b.t() @ a.t())
    for bias in (torch.randn(9), torch.randn(13, 9), torch.randn(1, 9)):
        got = unpadded_addmm(bias, a_p, b_p, pm, pn)
        assert got.is_contiguous()
        torch.testing.assert_close(got, torch.addmm(bias, a, b))
    batched_a, batched_b = torch.randn(4, 13, 21), torch.randn(4, 21, 9)
    batched = unpadded_mm(pad2d(batched_a, pm, pk), pad2d(batched_b, pk, pn), pm, pn)
    torch.testing.assert_close(batched, batched_a @ batched_b)


class _Graph:
    """A graph built from facts alone (the facts a stored graph keeps): claims of CUDA and
    16-bit values that a CPU test can still run with float32 tensors of those shapes."""

    def __init__(self, dtype: str = "bfloat16", device: str = "cuda:0") -> None:
        self.graph = fx.Graph()
        self.dtype, self.device = dtype, device

    def facts(self, node: fx.Node, shape: list[int]) -> fx.Node:
        node.meta["fcache_val"] = {"T": [shape, [shape[1], 1], self.dtype, self.device, 0, False]}
        return node

    def input(self, name: str, shape: list[int]) -> fx.Node:
        return self.facts(self.graph.placeholder(name), shape)

    def mm(self, a: fx.Node, b: fx.Node, shape: list[int]) -> fx.Node:
        return self.facts(self.graph.call_function(aten.mm.default, (a, b)), shape)


@pytest.mark.parametrize(
    ("shape", "dtype", "device", "padded"),
    [
        ((4096, 1024, 50257), "bfloat16", "cuda:0", True),  # GPT-2's output layer
        ((50257, 4096, 1024), "float16", "cuda:1", True),  # its weight's gradient
        ((4096, 1024, 32000), "bfloat16", "cuda:0", False),  # aligned: nothing to gain
        ((4096, 1024, 50257), "float32", "cuda:0", False),  # no 16-bit kernel to miss
        ((4096, 1024, 50257), "bfloat16", "cpu", False),  # no cuBLAS
        ((4096, 100, 50257), "bfloat16", "cuda:0", False),  # small: the copies would cost more
    ],
)
def test_only_large_misaligned_16_bit_cuda_matmuls_are_padded(
    shape: tuple[int, int, int], dtype: str, device: str, padded: bool
) -> None:
    m, k, n = shape
    g = _Graph(dtype, device)
    g.graph.output(g.mm(g.input("a", [m, k]), g.input("b", [k, n]), [m, n]))
    assert pad_matmuls(g.graph) == int(padded)
    if padded:
        (node,) = g.graph.find_nodes(op="call_function", target=unpadded_mm)
        assert node.args[2:] == (-m % 8, -n % 8)
    else:
        assert g.graph.find_nodes(op="call_function", target=aten.mm.default)


def test_a_gradient_read_both_ways_is_padded_once_and_the_products_are_right() -> None:
    # A backward's output layer: grad_in = grad @ w (K misaligned), grad_w = grad.t() @ x
    # (M misaligned): one padded copy of `grad` serves both.
    m, v, d = 520, 1001, 512
    g = _Graph()
    grad, w, x = g.input("grad", [m, v]), g.input("w", [v, d]), g.input("x", [m, d])
    grad_t = g.facts(g.graph.call_function(aten.permute.default, (grad, [1, 0])), [v, m])
    grad_t.meta["fcache_val"]["T"][1] = [1, v]
    g.graph.output((g.mm(grad, w, [m, d]), g.mm(grad_t, x, [v, d])))
    assert pad_matmuls(g.graph) == 2
    copies = g.graph.find_nodes(op="call_function", target=pad2d)
    assert [c.args[0].name for c in copies] == ["grad", "w"]
    module = fx.GraphModule(torch.nn.Module(), g.graph)
    torch.manual_seed(0)
    tensors = torch.randn(m, v), torch.randn(v, d), torch.randn(m, d)
    got_in, got_w = module(*tensors)
    assert got_in.is_contiguous() and got_w.is_contiguous()
    torch.testing.assert_close(got_in, tensors[0] @ tensors[1])
    torch.testing.assert_close(got_w, tensors[0].t() @ tensors[2])


def test_one_gradient_read_through_two_views_is_padded_once() -> None:
    # As AOTAutograd writes GPT-2's output layer: the incoming gradient [b, s, v] viewed
    # as [b*s, v] twice, once per matmul (the second view then transposed).
    b, s, v, d = 2, 260, 1001, 512
    g = _Graph()
    grad = g.input("grad", [b, s, v])
    grad.meta["fcache_val"]["T"][1] = [s * v, v, 1]
    w, x = g.input("w", [v, d]), g.input("x", [b * s, d])
    views = [g.facts(g.graph.call_function(aten.view.default, (grad, [b * s, v])), [b * s, v])
             for _ in range(2)]  # fmt: skip
    grad_t = g.facts(g.graph.call_function(aten.permute.default, (views[1], [1, 0])), [v, b * s])
    grad_t.meta["fcache_val"]["T"][1] = [1, v]
    g.graph.output((g.mm(views[0], w, [b * s, d]), g.mm(grad_t, x, [v, d])))
    assert pad_matmuls(g.graph) == 2
    copies = g.graph.find_nodes(op="call_function", target=pad2d)
    assert len([c for c in copies if c.args[0] in views]) == 1
    module = fx.GraphModule(torch.nn.Module(), g.graph)
    torch.manual_seed(0)
    tensors = torch.randn(b, s, v), torch.randn(v, d), torch.randn(b * s, d)
    got_in, got_w = module(*tensors)
    flat = tensors[0].view(b * s, v)
    torch.testing.assert_close(got_in, flat @ tensors[1])
    torch.testing.assert_close(got_w, flat.t() @ tensors[2])


def test_pad2d_zeroes_only_the_appended_strips_and_keeps_the_values() -> None:
    x = torch.randn(3, 5, 7)
    out = pad2d(x, 2, 3)
    assert out.shape == (3, 7, 10) and out.is_contiguous()
    assert torch.equal(out[..., :5, :7], x)
    assert not out[..., 5:, :].any() and not out[..., :5, 7:].any()
    assert torch.equal(pad2d(x, 0, 0), x)


def test_a_weight_saved_transposed_is_padded_from_its_dense_view() -> None:
    # The backward's output layer: grad_in = grad @ w, with w reaching the backward as the
    # forward's transposed view of it (w_t, column-major). Copying w_t would read across
    # rows; its transpose back is row-major, so that is what gets padded.
    m, v, d = 520, 1001, 512
    g = _Graph()
    grad, w_t = g.input("grad", [m, v]), g.input("w_t", [d, v])
    w_t.meta["fcache_val"]["T"][1] = [1, d]
    w = g.facts(g.graph.call_function(aten.permute.default, (w_t, [1, 0])), [v, d])
    g.graph.output(g.mm(grad, w, [m, d]))
    assert pad_matmuls(g.graph) == 1
    copies = g.graph.find_nodes(op="call_function", target=pad2d)
    assert {c.args[0]: c.args[1:] for c in copies} == {grad: (0, 7), w: (7, 0)}
    module = fx.GraphModule(torch.nn.Module(), g.graph)
    torch.manual_seed(0)
    grad_v, weight = torch.randn(m, v), torch.randn(v, d)
    torch.testing.assert_close(module(grad_v, weight.t()), grad_v @ weight)


def _returned_graph(also_saved: bool) -> tuple[fx.Graph, fx.Node]:
    # GPT-2's output layer in a forward: logits = (x @ w.t()) reshaped [b, s, v], returned.
    b, s, d, v = 2, 260, 512, 1001
    g = _Graph()
    x, w_t = g.input("x", [b * s, d]), g.input("w_t", [d, v])
    logits = g.mm(x, w_t, [b * s, v])
    shaped = g.graph.call_function(aten.view.default, (logits, [b, s, v]))
    shaped.meta["fcache_val"] = {"T": [[b, s, v], [s * v, v, 1], "bfloat16", "cuda:0", 0, False]}
    g.graph.output((shaped, x) if also_saved else (shaped,))
    if also_saved:  # the same value saved for the backward too: its traced layout stays
        (output,) = g.graph.find_nodes(op="output")
        output.args = ((shaped, x, shaped),)
    return g.graph, shaped


def test_a_returned_product_is_the_padded_result_restrided() -> None:
    graph, _ = _returned_graph(also_saved=False)
    assert pad_matmuls(graph, returned=(0,)) == 1
    assert not graph.find_nodes(op="call_function", target=aten.view.default)  # folded in
    (node,) = graph.find_nodes(op="call_function", target=unpadded_mm)
    assert node.args[2:] == (0, 7, (2, 260, 1001))
    module = fx.GraphModule(torch.nn.Module(), graph)
    torch.manual_seed(0)
    x, w_t = torch.randn(520, 512), torch.randn(512, 1001)
    (got,) = module(x, w_t)
    assert got.shape == (2, 260, 1001) and got.stride() == (260 * 1008, 1008, 1)
    assert not got._is_view()  # re-strided, as Inductor's wrapper returns it: writable
    torch.testing.assert_close(got, (x @ w_t).view(2, 260, 1001))


def test_a_product_also_saved_or_not_returned_is_made_dense() -> None:
    for also_saved, returned in ((True, (0,)), (False, ())):
        graph, shaped = _returned_graph(also_saved)
        assert pad_matmuls(graph, returned=returned) == 1
        (node,) = graph.find_nodes(op="call_function", target=unpadded_mm)
        assert len(node.args) == 4 and shaped in graph.nodes  # no shape: a dense copy
        module = fx.GraphModule(torch.nn.Module(), graph)
        x, w_t = torch.randn(520, 512), torch.randn(512, 1001)
        assert module(x, w_t)[0].is_contiguous()


def test_returned_outputs_are_the_callers_own_results_only() -> None:
    # What AOTAutograd's metadata says while it compiles a forward: after the new value of
    # a mutated input, the function's own results, not a view of an input, not what the
    # forward saves for the backward.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from fcache.engine.programs.graph import returned_outputs

    seen: dict[str, object] = {}

    def forward(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        (output,) = gm.graph.find_nodes(op="output")
        seen["returned"], seen["outputs"] = returned_outputs("forward"), len(output.args[0])
        return make_boxed_func(gm.forward)

    def backward(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        seen["backward"] = returned_outputs("backward")
        return make_boxed_func(gm.forward)

    def f(counter: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        counter.add_(1)
        y = x @ w
        return x.view(-1), y.relu(), y.sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=aot_autograd(fw_compiler=forward, bw_compiler=backward))
    w = torch.randn(4, 3, requires_grad=True)
    compiled(torch.zeros(2), torch.randn(5, 4), w)[1].sum().backward()
    # outputs: counter's new value, x.view (rebuilt by AOTAutograd), relu, sum, saved...
    assert seen["returned"] == (2, 3) and seen["outputs"] > 4
    assert seen["backward"] == ()

    def g(a: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.linalg.inv(a), (a @ w).relu()  # inv checks for errors: an effect

    torch._dynamo.reset()
    compiled = torch.compile(g, backend=aot_autograd(fw_compiler=forward, bw_compiler=backward))
    compiled(torch.randn(4, 4) + 4 * torch.eye(4), w)[1].sum().backward()
    # outputs: the effect's token, inv, relu, saved...: the caller's are after the token
    # (torch 2.13 makes inv's error check an effect; 2.11 does not: no token)
    assert seen["returned"] in ((1, 2), (0, 1))


def test_a_bias_free_linear_layers_product_is_returned_through_reshapes_only() -> None:
    # The shape GPT-2's logits leave a forward in, as AOTAutograd writes it: the output
    # layer's mm, reshaped to [batch, tokens, classes] (`_unsafe_view`, not a view the
    # caller could see through), at a returned position: what `pad_matmuls` keeps strided.
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from fcache.engine.programs.graph import returned_outputs
    from fcache.engine.rewrite.matmuls import _RESHAPES

    seen: list[object] = []

    def forward(gm: fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        (output,) = gm.graph.find_nodes(op="output")
        for position in returned_outputs("forward"):
            node = output.args[0][position]
            while node.target in _RESHAPES:
                node = node.args[0]
            seen.append(node.target)
        return make_boxed_func(gm.forward)

    head = torch.nn.Linear(64, 1001, bias=False)
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=forward, bw_compiler=lambda gm, _: make_boxed_func(gm))
    compiled = torch.compile(head, backend=backend)
    compiled(torch.randn(2, 16, 64)).sum().backward()
    assert seen == [aten.mm.default]


def test_a_returned_padded_product_trains_as_eager_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPT-2's output layer in small, on the CPU with the padding rules widened to it: the
    # logits come back as the padded product's memory (rows 104 apart), writable in place
    # as eager's are, and the step's loss and gradients are eager's.
    import fcache
    from fcache import process
    from fcache.engine.rewrite import matmuls

    monkeypatch.setattr(matmuls, "ALIGN", {"float32": 8})
    monkeypatch.setattr(matmuls, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(matmuls, "MIN_DIM", 16)

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(32, 64)
            self.out = torch.nn.Linear(64, 101, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(torch.nn.functional.gelu(self.up(x)))

    torch.manual_seed(0)
    model, reference = Head(), Head()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 24, 32)
    # Cut by op: the matmuls run between regions, where padding applies (in a layer's
    # region, cut by layer, they are the compiler's: Inductor pads them itself).
    settings = fcache.Settings(
        cache_dir=tmp_path, progress=False, executors=("eager",), regions="ops"
    )
    for _ in ("cold", "warm"):  # compiled here; then loaded, as a warm process loads it
        torch._dynamo.reset()
        process.reset()
        compiled = fcache.jit(model, settings=settings)
        for _ in range(3):  # views as traced, then folded
            model.zero_grad()
            reference.zero_grad()
            logits = compiled(x)
            assert logits.shape == (2, 24, 101) and logits.stride() == (24 * 104, 104, 1)
            expected = reference(x)
            torch.testing.assert_close(logits, expected)
            logits.mul_(2)  # in place, as a caller may (not possible on an autograd view)
            expected.mul_(2)
            logits.square().mean().backward()
            expected.square().mean().backward()
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad)
        # Both graphs rebuilt from their stored programs (the output positions the caller
        # keeps come from the program, not from a trace): warm, and in the cold process too
        # (a local class is not stored whole: declined after the first trace, the function
        # is traced again, as a warm process will, and finds the programs just stored).
        assert fcache.stats(compiled).programs_loaded == 2
    process.reset()
