"""Causal masks: an attention call whose mask is a constant causal mask runs as SDPA's
`is_causal=True`, as the model runs it in eager.

Hugging Face's models build their attention mask in `transformers.masking_utils`. A
training step (no key/value cache, no attention mask) first asks whether the batch packs
several sequences, by reading the position ids: in eager it finds none, hands SDPA no mask
and `is_causal=True`, and SDPA picks a causal kernel that skips the masked half of the
scores. Traced, the position ids cannot be read (Dynamo would have to branch on them), so
the graph builds a boolean [B, 1, L, S] mask that allows for packing, out of aranges when
the position ids are the default ones, and SDPA computes every score with a masked kernel.
torch.compile runs that graph as traced: on an H100 the attention of a 16-layer Llama
training step (batch 2 x 2048) took 7.4 ms of GPU time a step with the mask and 3.3 ms
with the causal kernel (bench/results/gpu-h100-causal-2026-11-26).

`restore_is_causal(gm)` finds each scaled_dot_product_attention call of a Dynamo graph whose
mask is computed from constants alone (no graph input, no module attribute, no private or
random function, in a graph that writes nothing in place: fixed for the traced shapes,
which Dynamo's guards keep), computes that mask once, and where it is exactly the mask
`is_causal=True` means (lower triangular, aligned at the top left, over every batch and
head), drops the mask and sets `is_causal`. A mask that depends on an input (padding,
packed sequences' position ids), a sliding window or anything else stays as it was.
Deterministic: the decision depends only on the graph and the values it computes from
constants.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

_SDPA = (
    torch._C._nn.scaled_dot_product_attention,
    torch.nn.functional.scaled_dot_product_attention,
)
# SDPA's parameters after (query, key, value), in order.
_PARAMS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
# A mask computed by more nodes than this is not looked at (Hugging Face's: about 30).
_MAX_NODES = 256
_INPLACE_OPERATORS = frozenset(
    {
        operator.iadd, operator.iand, operator.iconcat, operator.ifloordiv, operator.ilshift,
        operator.imatmul, operator.imod, operator.imul, operator.ior, operator.ipow,
        operator.irshift, operator.isub, operator.itruediv, operator.ixor,
        operator.setitem, operator.delitem,
    }
)  # fmt: skip


def restore_is_causal(gm: fx.GraphModule) -> int:
    """Rewrite, in place, each SDPA call whose mask is a constant causal mask into a call
    with `is_causal=True` and no mask (module docstring); the number rewritten."""
    if any(_writes(node) for node in gm.graph.nodes):
        # A write could reach a mask after it is made, through the mask or a view of it
        # (`mask[:, 0] = keep`): such a graph keeps its masks. Hugging Face's decoders'
        # graphs write nothing.
        return 0
    masks: dict[tuple[fx.Node, int | None, int | None], bool] = {}
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA or len(node.args) < 3:
            continue
        params = _params(node)
        mask = params.get("attn_mask")
        if not isinstance(mask, fx.Node) or params.get("is_causal"):
            continue
        shape = (mask, *_lengths(node))  # one mask may serve attentions of other lengths
        if shape not in masks:
            masks[shape] = _is_causal(*shape)
        if not masks[shape]:
            continue
        params["attn_mask"], params["is_causal"] = None, True
        node.args, node.kwargs = node.args[:3], params
        rewritten += 1
    if rewritten:
        for mask in {mask for mask, _, _ in masks}:
            _erase_unused(mask)
        gm.recompile()
        log.debug("fcache: %d attention calls run with is_causal instead of a mask", rewritten)
    return rewritten


def _params(node: fx.Node) -> dict[str, Any]:
    params = dict(zip(_PARAMS, node.args[3:], strict=False))
    params.update(node.kwargs)
    return params


def _lengths(node: fx.Node) -> tuple[int | None, int | None]:
    """The query's and the key's sequence lengths, as traced (None where unknown)."""
    query, key = _value(node.args[0]), _value(node.args[1])
    if not isinstance(query, torch.Tensor) or not isinstance(key, torch.Tensor):
        return None, None
    if query.dim() < 2 or key.dim() < 2:
        return None, None
    length, kv_length = query.shape[-2], key.shape[-2]
    if not isinstance(length, int) or not isinstance(kv_length, int):
        return None, None
    return length, kv_length


def _value(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def _is_causal(mask: fx.Node, length: int | None, kv_length: int | None) -> bool:
    """Whether `mask` is computed from constants alone and equals the causal mask of a
    `length` x `kv_length` attention, broadcast over its leading dimensions."""
    if length is None or kv_length is None:
        return False
    nodes = _ancestry(mask)
    if nodes is None:
        return False
    try:
        return _equals_causal(_evaluate(nodes), length, kv_length)
    except Exception as exc:  # what it cannot compute (or hold: memory), it does not rewrite
        log.debug("fcache: an attention mask was not computed at compile time: %s", exc)
        return False


def _equals_causal(value: Any, length: int, kv_length: int) -> bool:
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return False
    if tuple(value.shape[-2:]) != (length, kv_length):
        return False
    causal = torch.ones(length, kv_length, dtype=torch.bool, device=value.device).tril()
    if value.dtype == torch.bool:
        return bool(torch.equal(value, causal.expand_as(value)))
    if not value.is_floating_point():
        return False
    # An additive mask: zero where a score counts, -inf (or the dtype's lowest value, as
    # Hugging Face writes it, which softmax takes to exactly zero) where it does not.
    lowest = torch.finfo(value.dtype).min
    keep = causal.expand_as(value)
    return bool((value[keep] == 0).all() and (value[~keep] <= lowest).all())


def _ancestry(mask: fx.Node) -> list[fx.Node] | None:
    """Every node `mask` is computed from, in graph order; None unless all are calls of
    public functions or methods on constants that draw no random numbers (the graph writes
    nothing in place: restore_is_causal looks at none that does)."""
    seen: set[fx.Node] = set()
    stack = [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        if node.op not in ("call_function", "call_method"):
            return None
        if _private(node) or _random(node):
            return None
        seen.add(node)
        if len(seen) > _MAX_NODES:
            return None
        stack.extend(node.all_input_nodes)
    order = {node: i for i, node in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _writes(node: fx.Node) -> bool:
    """Whether the node may write a tensor in place (a module's call: unknown, so yes)."""
    if node.op == "call_module":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    if "out" in node.kwargs:
        return True
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.endswith("__")
    target = node.target
    if target in _INPLACE_OPERATORS:
        return True
    name = getattr(target, "__name__", "")
    return getattr(target, "__module__", None) not in ("operator", "_operator") and (
        name.endswith("_") and not name.endswith("__")
    )


def _private(node: fx.Node) -> bool:
    """A private function (`torch._functorch`'s vmap levels, `torch._C`'s state setters):
    it may change the process's state, and its partner (the level's decrement, say) need
    not be in the mask's ancestry, so running it alone could leave that state changed."""
    if node.op != "call_function":
        return False
    module = getattr(node.target, "__module__", None) or ""
    if module in ("operator", "_operator"):
        return False
    return getattr(node.target, "__name__", "").startswith("_") or "._" in f".{module}"


# Functions and methods that draw random numbers: computing one at compile time would
# move the process's random number generator, and a rewrite would drop a draw that every
# step makes. By name; the in-place ones (`uniform_`) are writes already. Uninitialized
# memory (`empty`) too: what it holds differs from one step to the next.
_RANDOM = frozenset({"bernoulli", "multinomial", "normal", "poisson", "rrelu", "randperm"})


def _random(node: fx.Node) -> bool:
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    name = str(name)
    return name in _RANDOM or name.startswith(("rand", "empty", "new_empty")) or "dropout" in name


def _evaluate(nodes: list[fx.Node]) -> Any:
    """Run `nodes` (an ancestry, in order) eagerly on real tensors; the last one's value."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    env: dict[fx.Node, Any] = {}
    with unset_fake_temporarily(), torch.no_grad():
        for node in nodes:
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            if node.op == "call_method":
                self, *rest = args
                env[node] = getattr(self, node.target)(*rest, **kwargs)
            else:
                env[node] = node.target(*args, **kwargs)
    return env[nodes[-1]]


def _erase_unused(mask: fx.Node) -> None:
    """Erase what computed `mask` where nothing else uses it any more (all of it pure: the
    graph writes nothing, and `_ancestry` refused random and private calls)."""
    nodes = _ancestry(mask) or []
    for node in reversed(nodes):
        if not node.users:
            node.graph.erase_node(node)
