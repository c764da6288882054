"""Hugging Face models for the benchmark: random weights from configs (no downloads).

The shapes of the project's measurements (README, issues #14-#16): hidden 1024, 16 heads,
batch 2 x 2048 tokens, bf16 on the GPU; Llama with 8 key/value heads, intermediate 2816,
vocab 32000 and SDPA attention; GPT-2 with its own vocabulary (50257) and positions for
2048 tokens. Dropout is off, so every system computes the same function and `--check` can
compare them with eager. No key/value cache is built (`use_cache=False`, as a training job
sets it): a step computes nothing with it, and a layer compiled on its own
(torch.compile-regional, fcache-blocks) would be traced again for every layer's cache
entry.
"""

from __future__ import annotations

import torch

FAMILIES = ("hf-llama", "hf-gpt2")


def build(family: str, layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    """The model, seeded, in train mode. `vocab` applies to Llama; GPT-2 keeps its own."""
    torch.manual_seed(0)
    if family == "hf-llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            vocab_size=vocab, hidden_size=dim, intermediate_size=_llama_ffn(dim),
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), max_position_embeddings=max(seq, 128),
            attn_implementation="sdpa", use_cache=False,
        )  # fmt: skip
        return LlamaForCausalLM(cfg).train()
    if family == "hf-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            n_embd=dim, n_layer=layers, n_head=heads, n_positions=max(seq, 128),
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa",
            use_cache=False,
        )  # fmt: skip
        return GPT2LMHeadModel(cfg).train()
    raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")


def vocab_size(model: torch.nn.Module) -> int:
    return int(model.config.vocab_size)  # type: ignore[union-attr]


def _llama_ffn(dim: int) -> int:
    # 2816 at d=1024, as in the measurements: 8/3 d rounded up to a multiple of 256.
    return -(-(8 * dim // 3) // 256) * 256
