"""Models nobody here wrote: tiny random-weight Hugging Face `transformers` architectures of
different kinds, built from configs (no downloads), with one training step each. Dropout
is off, so that every system computes the same function. Llama, GPT-2 and GPT-NeoX train
without a key/value cache (`use_cache=False`, as training scripts run decoders): traced, their
causal mask is then a tensor, which fcache gives back to SDPA as `is_causal`
(fcache.frontend.causal); Mixtral keeps the default cache (no mask when traced).

Shared by the CPU matrix (tests/models) and the GPU matrix (tests/gpu/test_matrix.py).
Each entry builds a model with a given number of layers and returns the inputs of one
step; `loss` turns the model's output into a scalar the same way for every system.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Entry:
    """One architecture: `build(layers)` -> model (float32, train mode, seeded);
    `inputs(batch, device)` -> the keyword arguments of one forward."""

    name: str
    kind: str
    build: Callable[[int], torch.nn.Module]
    inputs: Callable[[torch.device], dict[str, torch.Tensor]]


def _seeded(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    model = make()
    model.train()
    return model


def _tokens(vocab: int, batch: int = 2, seq: int = 16) -> Callable[[torch.device], dict[str, Any]]:
    def inputs(device: torch.device) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(1)
        return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=gen).to(device)}

    return inputs


def _pixels(channels: int, size: int) -> Callable[[torch.device], dict[str, Any]]:
    def inputs(device: torch.device) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(1)
        return {"pixel_values": torch.randn(2, channels, size, size, generator=gen).to(device)}

    return inputs


def _seq2seq(vocab: int) -> Callable[[torch.device], dict[str, Any]]:
    def inputs(device: torch.device) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocab, (2, 12), generator=gen)
        dec = torch.randint(0, vocab, (2, 8), generator=gen)
        return {"input_ids": ids.to(device), "decoder_input_ids": dec.to(device)}

    return inputs


def llama(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return _seeded(lambda: LlamaForCausalLM(cfg))


def gpt2(layers: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=128, n_embd=32, n_layer=layers, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return _seeded(lambda: GPT2LMHeadModel(cfg))


def bert(layers: int) -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return _seeded(lambda: BertForMaskedLM(cfg))


def vit(layers: int) -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=10, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return _seeded(lambda: ViTForImageClassification(cfg))


def mixtral(layers: int) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    return _seeded(lambda: MixtralForCausalLM(cfg))


def t5(layers: int) -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=layers, num_heads=4,
        decoder_start_token_id=0, dropout_rate=0.0,
    )  # fmt: skip
    return _seeded(lambda: T5ForConditionalGeneration(cfg))


def gpt_neox(layers: int) -> torch.nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, use_parallel_residual=True,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return _seeded(lambda: GPTNeoXForCausalLM(cfg))


def resnet(layers: int) -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    # `layers` residual blocks in the first stage; the other stages keep one.
    cfg = ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[layers, 1],
        layer_type="basic", num_labels=10,
    )  # fmt: skip
    return _seeded(lambda: ResNetForImageClassification(cfg))


ZOO = (
    Entry("llama", "decoder", llama, _tokens(128)),
    Entry("gpt2", "decoder", gpt2, _tokens(128)),
    Entry("bert", "encoder", bert, _tokens(128)),
    Entry("vit", "vision transformer", vit, _pixels(3, 32)),
    Entry("mixtral", "mixture-of-experts decoder", mixtral, _tokens(128)),
    Entry("t5", "encoder-decoder", t5, _seq2seq(128)),
    Entry("gpt_neox", "decoder, parallel residuals", gpt_neox, _tokens(128)),
    Entry("resnet", "convolutional", resnet, _pixels(3, 32)),
)
BY_NAME = {e.name: e for e in ZOO}


def loss(output: Any) -> torch.Tensor:
    """One scalar from any model's output (logits): the same for every system."""
    logits = output.logits if hasattr(output, "logits") else output[0]
    return logits.float().pow(2).mean()
