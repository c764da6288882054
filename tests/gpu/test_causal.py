"""Attention with its causal kernel on a GPU (fcache.frontend.causal): a Hugging Face
decoder trained without a key/value cache traces a [B, 1, L, S] mask, which fcache gives
back to SDPA as is_causal, with this machine's torch and transformers, and the graph then
computes what eager does (which runs SDPA causal itself). fcache's whole step against
eager, rewritten masks included, is test_matrix's (its decoders train without a cache).
Skipped without CUDA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx as fx

from fcache.frontend.causal import restore_is_causal

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("family", ["hf-llama", "hf-gpt2"])
def test_a_decoder_without_a_cache_gets_causal_attention_and_eagers_logits(family: str) -> None:
    pytest.importorskip("transformers")
    from bench import hf

    model = hf.build(family, 2, 256, 4, 1024, 512).to("cuda", torch.bfloat16)
    tokens = torch.randint(0, hf.vocab_size(model), (2, 512), device="cuda")
    rewritten: list[int] = []

    def backend(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        rewritten.append(restore_is_causal(gm))
        return gm.forward  # the rewritten graph, run op by op

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(tokens).logits
        expected = model(tokens).logits
    torch._dynamo.reset()
    assert sum(rewritten) == 2, rewritten  # one attention per layer
    torch.testing.assert_close(got, expected)
