"""Hugging Face models for the benchmark: random weights from configs (no downloads).

The shapes of the project's measurements (README, issues #14-#16): hidden 1024, 16 heads,
batch 2 x 2048 tokens, bf16 on the GPU; Llama with 8 key/value heads, intermediate 2816,
vocab 32000 and SDPA attention; GPT-2 with its own vocabulary (50257) and positions for
2048 tokens. Dropout is off, so every system computes the same function and `--check` can
compare them with eager. No key/value cache is built (`use_cache=False`, as a training job
sets it): a step computes nothing with it, and a layer compiled on its own
(torch.compile-regional, fcache-blocks) would be traced again for every layer's cache
entry.

The architecture matrix (issue #41, `python -m bench.run --family hf-gemma2,...`): decoders,
encoders, encoder-decoders, vision, audio, mixtures of experts and a state-space model,
each built from its config with the run's depth, hidden size and heads (`ARCHS`), SDPA
attention where the model has it (eager where it does not: Gemma2's soft-capping). Inputs
are what each kind takes (`inputs`): token ids; ids and decoder ids (T5, Whisper's
decoder); pixels (ViT: an image of about `seq` patches); audio features (Whisper: `seq`
encoder positions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a model is built: bench.run only lists names
    import torch


@dataclass(frozen=True)
class Arch:
    """How to build one architecture: `config(layers, dim, heads, vocab, seq)` -> the
    model, and the kind of inputs it takes ("tokens", "seq2seq", "pixels", "audio")."""

    build: Callable[[int, int, int, int, int], torch.nn.Module]
    inputs: str = "tokens"


def _ffn(dim: int) -> int:
    # 2816 at d=1024, as in the measurements: 8/3 d rounded up to a multiple of 256.
    return -(-(8 * dim // 3) // 256) * 256


def _decoder(
    config: str,
    model: str,
    attention: str = "sdpa",
    head_dim: bool = False,
    sliding: bool = False,
    **extra: Any,
) -> Callable[[int, int, int, int, int], torch.nn.Module]:
    """A Llama-like decoder of `transformers`, by its config and model class names.
    `head_dim`: set it from the hidden size (configs whose default is a fixed number);
    `sliding`: a sliding window of a quarter of the sequence (its masks in the graph)."""

    def build(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
        import transformers

        options = dict(extra)
        if head_dim:
            options["head_dim"] = dim // heads
        if sliding:
            options["sliding_window"] = max(16, seq // 4)
        cfg = getattr(transformers, config)(
            vocab_size=vocab, hidden_size=dim, intermediate_size=_ffn(dim),
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), max_position_embeddings=max(seq, 128),
            attn_implementation=attention, use_cache=False, **options,
        )  # fmt: skip
        return getattr(transformers, model)(cfg)

    return build


def _gpt2(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_embd=dim, n_layer=layers, n_head=heads, n_positions=max(seq, 128),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa",
        use_cache=False,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg)


def _opt(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        ffn_dim=4 * dim, max_position_embeddings=max(seq, 128), dropout=0.0,
        attention_dropout=0.0, word_embed_proj_dim=dim, attn_implementation="sdpa",
        use_cache=False,
    )  # fmt: skip
    return OPTForCausalLM(cfg)


def _falcon(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(
        vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        attention_dropout=0.0, hidden_dropout=0.0, attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return FalconForCausalLM(cfg)


def _bigcode(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    cfg = GPTBigCodeConfig(
        vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads, n_positions=max(seq, 128),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return GPTBigCodeForCausalLM(cfg)


def _gpt_neox(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * dim, max_position_embeddings=max(seq, 128),
        use_parallel_residual=True, attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return GPTNeoXForCausalLM(cfg)


def _bert(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * dim, max_position_embeddings=max(seq, 128),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return BertForMaskedLM(cfg)


def _t5(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=vocab, d_model=dim, d_kv=dim // heads, d_ff=4 * dim, num_layers=layers,
        num_heads=heads, decoder_start_token_id=0, dropout_rate=0.0, use_cache=False,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg)


def _vit(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * dim, image_size=_image_size(seq), patch_size=16, num_labels=1000,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return ViTForImageClassification(cfg)


def _whisper(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    cfg = WhisperConfig(
        vocab_size=vocab, d_model=dim, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=4 * dim, decoder_ffn_dim=4 * dim, max_source_positions=seq,
        max_target_positions=max(_DECODER_TOKENS, 128), dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, attn_implementation="sdpa", use_cache=False,
        decoder_start_token_id=0, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return WhisperForConditionalGeneration(cfg)


def _mamba(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers, use_cache=False)
    return MambaForCausalLM(cfg)


ARCHS: dict[str, Arch] = {
    "hf-llama": Arch(_decoder("LlamaConfig", "LlamaForCausalLM")),
    "hf-gpt2": Arch(_gpt2),
    # Soft-capped attention scores: no SDPA path, eager attention.
    "hf-gemma2": Arch(
        _decoder("Gemma2Config", "Gemma2ForCausalLM", "eager", head_dim=True, sliding=True)
    ),
    "hf-gemma3": Arch(
        _decoder("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=True, sliding=True)
    ),
    "hf-phi3": Arch(
        _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0, bos_token_id=0, eos_token_id=0)
    ),
    "hf-qwen2": Arch(_decoder("Qwen2Config", "Qwen2ForCausalLM")),
    "hf-mistral": Arch(_decoder("MistralConfig", "MistralForCausalLM", sliding=True)),
    "hf-opt": Arch(_opt),
    "hf-falcon": Arch(_falcon),
    "hf-bigcode": Arch(_bigcode),
    "hf-gpt-neox": Arch(_gpt_neox),
    "hf-mixtral": Arch(
        _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)
    ),
    "hf-qwen2-moe": Arch(
        _decoder(
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        )
    ),
    "hf-bert": Arch(_bert),
    "hf-t5": Arch(_t5, "seq2seq"),
    "hf-vit": Arch(_vit, "pixels"),
    "hf-whisper": Arch(_whisper, "audio"),
    "hf-mamba": Arch(_mamba),
}
FAMILIES = tuple(ARCHS)
_DECODER_TOKENS = 64  # decoder length of the encoder-decoders (T5, Whisper)


def build(family: str, layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    """The model, seeded, in train mode. `vocab` applies to the models that take one
    (GPT-2 keeps its own)."""
    if family not in ARCHS:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")
    import torch

    torch.manual_seed(0)
    return ARCHS[family].build(layers, dim, heads, vocab, seq).train()


def vocab_size(model: torch.nn.Module) -> int:
    return int(model.config.vocab_size)  # type: ignore[union-attr]


def inputs(
    family: str, model: torch.nn.Module, batch: int, seq: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """One step's keyword arguments for `model` (on the CPU, float32 where floating)."""
    import torch

    kind = ARCHS[family].inputs
    cfg: Any = model.config
    if kind == "pixels":
        size = _image_size(seq)
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    if kind == "audio":
        mels = int(cfg.num_mel_bins)
        return {
            "input_features": torch.randn(batch, mels, 2 * seq, generator=generator),
            "decoder_input_ids": _ids(cfg.vocab_size, batch, _DECODER_TOKENS, generator),
        }
    found = {"input_ids": _ids(vocab_size(model), batch, seq, generator)}
    if kind == "seq2seq":
        found["decoder_input_ids"] = _ids(vocab_size(model), batch, _DECODER_TOKENS, generator)
    return found


def _ids(vocab: int, batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=generator)


def _image_size(seq: int) -> int:
    """An image of about `seq` 16-pixel patches."""
    return 16 * max(1, math.isqrt(seq))
