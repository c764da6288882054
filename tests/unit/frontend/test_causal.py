"""Attention with a constant causal mask runs as SDPA's is_causal (fcache.frontend.causal):
on real Dynamo graphs, with masks that are causal and masks that only look like it."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from fcache.frontend.causal import restore_is_causal

L = 8


def _sdpa_calls(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch._C._nn.scaled_dot_product_attention]


def _rewrite(fn: Callable[..., Any], *args: Any) -> tuple[int, list[fx.Node], Any]:
    """`fn` compiled through a backend that rewrites its Dynamo graph: how many calls were
    rewritten, the SDPA calls after, and the compiled result (checked against the graph
    as traced, run on the same inputs)."""
    seen: dict[str, Any] = {}

    def backend(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        original = copy.deepcopy(gm)
        seen["rewritten"] = restore_is_causal(gm)
        seen["calls"] = _sdpa_calls(gm)
        seen["original"] = original
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    expected = fn(*args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    return seen["rewritten"], seen["calls"], out


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 2, L, 16, generator=gen) for _ in range(3))  # type: ignore[return-value]


def _positions() -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(L)[:, None]
    return rows, torch.arange(L)[None, :]


def test_a_boolean_causal_mask_built_from_aranges_becomes_is_causal() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        mask = (cols <= rows)[None, None].expand(2, 1, L, L)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    rewritten, calls, _ = _rewrite(attend, *_qkv())
    assert rewritten == 1
    (call,) = calls
    assert call.kwargs["is_causal"] is True and call.kwargs["attn_mask"] is None
    # The mask's computation is gone from the graph.
    assert not any(n.target is torch.arange for n in call.graph.nodes)


def test_a_mask_passed_by_position_becomes_is_causal_keeping_the_other_arguments() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        return F.scaled_dot_product_attention(q, k, v, cols <= rows, 0.0, False, scale=0.5)

    rewritten, (call,), _ = _rewrite(attend, *_qkv())
    assert rewritten == 1
    assert call.args[3:] == () and call.kwargs["scale"] == 0.5
    assert call.kwargs["is_causal"] is True and call.kwargs["attn_mask"] is None


def test_an_additive_causal_mask_becomes_is_causal() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        lowest = torch.finfo(torch.float32).min
        mask = torch.where(cols <= rows, 0.0, lowest)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert _rewrite(attend, *_qkv())[0] == 1


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(lambda rows, cols: cols < rows, id="diagonal-masked"),
        pytest.param(lambda rows, cols: (cols <= rows) & (cols > rows - 3), id="sliding-window"),
        pytest.param(lambda rows, cols: cols >= 0, id="no-mask-at-all"),
    ],
)
def test_a_constant_mask_that_is_not_causal_stays(shape: Callable[..., torch.Tensor]) -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        mask = shape(rows, cols)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    # The diagonal-masked case leaves row 0 with nothing to attend to: NaN in both.
    q, k, v = _qkv()
    seen: list[int] = []

    def backend(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        seen.append(restore_is_causal(gm))
        assert all(c.kwargs.get("attn_mask") is not None for c in _sdpa_calls(gm))
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(attend, backend=backend, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v), equal_nan=True)
    assert seen == [0]


def test_a_mask_made_under_vmap_stays_and_leaves_no_vmap_level_behind() -> None:
    """Dynamo writes torch.vmap as calls of torch._functorch's private functions that open
    and close a vmap level; the mask's ancestry holds the opening one, not the closing
    one. Such a mask is not computed at compile time, and no level is left open."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = torch.arange(L), torch.arange(L)
        mask = torch.vmap(lambda row: cols <= row)(rows)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert _rewrite(attend, *_qkv())[0] == 0
    assert torch._C._functorch.maybe_current_level() is None


def test_a_random_mask_is_not_drawn_at_compile_time() -> None:
    """Computing it would move the process's random number generator."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        mask = (cols <= rows) | (torch.rand(L, L) < 0.0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def backend(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        state = torch.get_rng_state()
        assert restore_is_causal(gm) == 0
        assert torch.equal(torch.get_rng_state(), state)
        return gm.forward

    torch._dynamo.reset()
    q, k, v = _qkv()
    out = torch.compile(attend, backend=backend, fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, attend(q, k, v))


def test_a_mask_computed_from_an_input_stays() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> Any:
        rows, cols = _positions()
        mask = (cols <= rows) & keep[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    # An input that happens to keep everything: the mask is causal in value, but only for
    # this input.
    keep = torch.ones(2, L, dtype=torch.bool)
    assert _rewrite(attend, *_qkv(), keep)[0] == 0


def _tril() -> torch.Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril()


def _setitem(keep: torch.Tensor) -> torch.Tensor:
    mask = _tril()
    mask[0, L - 1] = True
    return mask


def _method(keep: torch.Tensor) -> torch.Tensor:
    mask = _tril()
    mask.logical_and_(keep)
    return mask


def _out(keep: torch.Tensor) -> torch.Tensor:
    mask = _tril()
    torch.logical_and(mask, keep, out=mask)
    return mask


def _view(keep: torch.Tensor) -> torch.Tensor:
    mask = _tril()
    mask[0].fill_(True)
    return mask


def _ancestor(keep: torch.Tensor) -> torch.Tensor:
    rows, cols = _positions()
    rows.add_(keep[:, :1].sum() - L)  # zero for the input below, not for every input
    return cols <= rows


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_setitem, id="setitem"),
        pytest.param(_method, id="in-place-method"),
        pytest.param(_out, id="out-argument"),
        pytest.param(_view, id="through-a-view"),
        pytest.param(_ancestor, id="an-ancestor-written"),
    ],
)
def test_a_mask_written_in_place_after_it_is_made_stays(
    make: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """The write is a user of the mask, not one of the nodes it is computed from; it may
    depend on an input (an all-true one here: the graph's mask is causal for this input
    and not for the next)."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=make(keep))

    keep = torch.ones(L, L, dtype=torch.bool)
    assert _rewrite(attend, *_qkv(), keep)[0] == 0


def test_one_mask_serving_attentions_of_two_lengths_is_judged_for_each() -> None:
    """A [1, 1] mask is causal for a one-token attention and lets every token see every
    other one for a longer attention: only the first call is rewritten."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(1, 1, dtype=torch.bool).tril()
        one = F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], mask)
        return one + F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    rewritten, calls, _ = _rewrite(attend, *_qkv())
    assert rewritten == 1
    assert [c.kwargs.get("is_causal", False) for c in calls] == [True, False]


def test_a_causal_mask_of_a_shorter_query_aligned_at_the_top_left_becomes_is_causal() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(L // 2, L, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q[:, :, : L // 2], k, v, attn_mask=mask)

    assert _rewrite(attend, *_qkv())[0] == 1


def test_an_additive_mask_of_minus_infinity_becomes_is_causal() -> None:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows, cols = _positions()
        mask = torch.where(cols <= rows, 0.0, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    assert _rewrite(attend, *_qkv())[0] == 1


def _entry(name: str) -> Any:
    from tests.models import zoo

    return next(e for e in zoo.ZOO if e.name == name)


def test_hugging_face_llama_gets_is_causal_without_padding_and_keeps_a_padding_mask() -> None:
    """Without a key/value cache (training: use_cache=False) transformers builds a
    [B, 1, L, S] mask under Dynamo (it cannot read whether the batch packs sequences) and
    none in eager: the rewrite gives the traced model eager's call; a padded batch keeps
    its mask."""
    pytest.importorskip("transformers")
    from tests.models import zoo

    model = zoo.llama(2)
    ids = _entry("llama").inputs(torch.device("cpu"))["input_ids"]
    with torch.no_grad():
        rewritten, calls, _ = _rewrite(lambda x: model(input_ids=x, use_cache=False).logits, ids)
    assert rewritten == 2 and all(c.kwargs["is_causal"] is True for c in calls)

    padding = torch.ones_like(ids)
    padding[0, :3] = 0
    with torch.no_grad():
        rewritten, calls, _ = _rewrite(
            lambda x, m: model(input_ids=x, attention_mask=m, use_cache=False).logits, ids, padding
        )
    assert rewritten == 0 and all(c.kwargs["attn_mask"] is not None for c in calls)


def test_fcache_jit_runs_hugging_face_llama_causally_with_eagers_gradients(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Through fcache's own backend, forward and backward, against eager. Regions go to
    the text executor (tests/text_executor.py: the rewrite is fcache's, not a compiler's;
    Inductor's C++ builds of the model's regions cost half a minute on 2 cores)."""
    pytest.importorskip("transformers")
    import fcache
    from tests.models import zoo
    from tests.text_executor import register

    register()
    model = zoo.llama(2)
    reference = copy.deepcopy(model)
    ids = _entry("llama").inputs(torch.device("cpu"))["input_ids"]
    settings = fcache.Settings(cache_dir=tmp_path, compile_workers=1, executors=("text", "eager"))
    with caplog.at_level(logging.DEBUG, logger="fcache.frontend.causal"):
        zoo.loss(fcache.jit(model, settings=settings)(input_ids=ids, use_cache=False)).backward()
    assert "2 attention calls run with is_causal" in caplog.text
    zoo.loss(reference(input_ids=ids, use_cache=False)).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
