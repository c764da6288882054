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

The survey's architectures (`python -m bench.survey`; 39 more that nobody here had tried
before a CPU survey of them on 2026-11-28): Llama-like decoders in one table (`_DECODERS`:
config class, model class, what differs), the rest built by small functions: GPT-J,
CodeGen, GPT-Neo, BLOOM and MPT (ALiBi), DBRX (experts looping over their tokens), Jamba,
Mamba2 and RecurrentGemma (transformers' pure-torch scans), BART and Marian, BERT-likes,
Swin, ConvNeXt, DeiT, SegFormer (hierarchical vision: two stages of `layers` split between
them), CLIP's and SigLIP's vision towers with a classification head, and Wav2Vec2 (a
waveform of `seq` frames, its weight-normed position convolution). Each builds at the
tests' size (2 layers, d=64) and at the GPU matrix's (4 layers, d=512, 8 heads, vocab
32000, seq 1024).

A second CPU survey (2026-11-29) added 13 more, for what those lack: OLMoE, Llama4
(chunked attention, NoPE layers, complex rotary embeddings, a top-1 expert), SmolLM3,
ERNIE 4.5 MoE, LFM2 (gated short convolutions), Qwen3-Next (gated delta rule), Zamba2 (a
transformer block shared between Mamba2 layers), Switch Transformers (capacity-limited
top-1 experts in an encoder-decoder), Longformer (sliding-window attention in chunks),
MPNet (relative position buckets), DINOv2 (interpolated position embeddings), ResNet
(batch norm's running statistics) and Speech2Text (strided convolutions over filterbank
frames: inputs of kind "speech"); they build at both sizes too.
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
    model, and the kind of inputs it takes ("tokens", "seq2seq", "pixels", "audio" features,
    a "waveform", "speech": filterbank frames and decoder ids)."""

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

        # A callable option is sized from the shape (`_head`, `_twice`...); None drops one
        # of the defaults below (a config that has no such field).
        options = {k: v(dim, heads, seq) if callable(v) else v for k, v in extra.items()}
        if head_dim:
            options["head_dim"] = dim // heads
        if sliding:
            options["sliding_window"] = max(16, seq // 4)
        fields = dict(
            vocab_size=vocab, hidden_size=dim, intermediate_size=_ffn(dim),
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2), max_position_embeddings=max(seq, 128),
            attn_implementation=attention, use_cache=False,
        )  # fmt: skip
        fields.update(options)
        cfg = getattr(transformers, config)(**{k: v for k, v in fields.items() if v is not None})
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


# -- the survey's architectures (python -m bench.survey) -------------------------------------
# Sizes that follow the shape, for the tables' options: `_head` (dim / heads), `_twice`
# (2 dim: an expert's width), `_half` (dim / 2: low ranks, factorized embeddings), `_window`
# (a quarter of the sequence: local attention that masks at every size, 4 tokens at seq 16),
# `_heads`, `_seq`, `_dt_rank` (Mamba's dim / 16).


def _head(dim: int, heads: int, seq: int) -> int:
    return dim // heads


def _twice(dim: int, heads: int, seq: int) -> int:
    return 2 * dim


def _half(dim: int, heads: int, seq: int) -> int:
    return dim // 2


def _window(dim: int, heads: int, seq: int) -> int:
    return max(4, seq // 4)


def _heads(dim: int, heads: int, seq: int) -> int:
    return heads


def _half_heads(dim: int, heads: int, seq: int) -> int:
    return max(1, heads // 2)


def _seq(dim: int, heads: int, seq: int) -> int:
    return seq


def _half_seq(dim: int, heads: int, seq: int) -> int:
    return max(2, seq // 2)


def _dt_rank(dim: int, heads: int, seq: int) -> int:
    return max(1, dim // 16)  # Mamba's default: ceil(dim / 16)


def _config(config: str, **fields: Any) -> Any:
    import transformers

    return getattr(transformers, config)(**fields)


def _model(model: str, cfg: Any) -> torch.nn.Module:
    import transformers

    return getattr(transformers, model)(cfg)  # type: ignore[no-any-return]


def _gptj(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "GPTJConfig", vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads,
        rotary_dim=dim // heads // 2, n_positions=max(seq, 128), resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    return _model("GPTJForCausalLM", cfg)


def _codegen(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "CodeGenConfig", vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads,
        rotary_dim=dim // heads // 2, n_positions=max(seq, 128), n_ctx=max(seq, 128),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    return _model("CodeGenForCausalLM", cfg)


def _gpt_neo(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Global and local attention alternating, as GPT-Neo's checkpoints have them.
    pattern = [[["global", "local"], layers // 2]] + [[["global"], 1]] * (layers % 2)
    cfg = _config(
        "GPTNeoConfig", vocab_size=vocab, hidden_size=dim, num_layers=layers, num_heads=heads,
        attention_types=pattern, window_size=_window(dim, heads, seq),
        max_position_embeddings=max(seq, 128), resid_dropout=0.0, embed_dropout=0.0,
        attention_dropout=0.0, use_cache=False,
    )  # fmt: skip
    return _model("GPTNeoForCausalLM", cfg)


def _bloom(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "BloomConfig", vocab_size=vocab, hidden_size=dim, n_layer=layers, n_head=heads,
        hidden_dropout=0.0, attention_dropout=0.0, use_cache=False,
    )  # fmt: skip
    return _model("BloomForCausalLM", cfg)


def _mpt(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "MptConfig", vocab_size=vocab, d_model=dim, n_layers=layers, n_heads=heads,
        max_seq_len=max(seq, 128), resid_pdrop=0.0, emb_pdrop=0.0, use_cache=False,
        attn_config={"attn_pdrop": 0, "alibi": True},  # an int: MPT's config checks its type
    )  # fmt: skip
    return _model("MptForCausalLM", cfg)


def _dbrx(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Its experts loop over the tokens routed to them (a loop over data: a graph break).
    cfg = _config(
        "DbrxConfig", vocab_size=vocab, d_model=dim, n_layers=layers, n_heads=heads,
        max_seq_len=max(seq, 128), resid_pdrop=0.0, emb_pdrop=0.0, use_cache=False,
        attn_config={"kv_n_heads": max(1, heads // 2), "attn_pdrop": 0.0,
                     "rope_theta": 10000.0, "clip_qkv": 8.0},
        ffn_config={"ffn_hidden_size": 2 * dim, "moe_num_experts": 4, "moe_top_k": 2},
        attn_implementation="sdpa",
    )  # fmt: skip
    return _model("DbrxForCausalLM", cfg)


def _mamba2(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # transformers' pure-torch path (no mamba_ssm kernels); heads x head_dim = 2 x hidden.
    cfg = _config(
        "Mamba2Config", vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers,
        num_heads=heads, head_dim=2 * dim // heads, state_size=16, n_groups=1, expand=2,
        conv_kernel=4, chunk_size=min(256, max(8, seq // 2)), use_cache=False,
    )  # fmt: skip
    return _model("Mamba2ForCausalLM", cfg)


def _recurrent_gemma(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Recurrent (RG-LRU) and local-attention blocks alternating.
    cfg = _config(
        "RecurrentGemmaConfig", vocab_size=vocab, hidden_size=dim, intermediate_size=2 * dim,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=1,
        lru_width=dim, attention_window_size=_window(dim, heads, seq), conv1d_width=4,
        block_types=["recurrent", "attention"], use_cache=False, attn_implementation="sdpa",
    )  # fmt: skip
    return _model("RecurrentGemmaForCausalLM", cfg)


def _seq2seq(config: str, model: str, **extra: Any) -> Callable[..., torch.nn.Module]:
    """A BART-like encoder-decoder (BART, Marian)."""

    def build(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
        cfg = _config(
            config, vocab_size=vocab, d_model=dim, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=heads, decoder_attention_heads=heads,
            encoder_ffn_dim=4 * dim, decoder_ffn_dim=4 * dim,
            max_position_embeddings=max(seq, _DECODER_TOKENS, 128), dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0, use_cache=False,
            attn_implementation="sdpa", **extra,
        )  # fmt: skip
        return _model(model, cfg)

    return build


def _encoder(config: str, model: str, **extra: Any) -> Callable[..., torch.nn.Module]:
    """A BERT-like encoder with a masked-LM head; callable options as `_decoder`'s."""

    def build(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
        fields = dict(
            vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=4 * dim,
            # RoBERTa's positions start after its padding index (2 more)
            max_position_embeddings=max(seq, 128) + 2, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        fields.update({k: v(dim, heads, seq) if callable(v) else v for k, v in extra.items()})
        return _model(model, _config(config, **fields))

    return build


def _distilbert(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "DistilBertConfig", vocab_size=vocab, dim=dim, n_layers=layers, n_heads=heads,
        hidden_dim=4 * dim, max_position_embeddings=max(seq, 128), dropout=0.0,
        attention_dropout=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return _model("DistilBertForMaskedLM", cfg)


def _modernbert(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Global attention every second layer, local (a window of a quarter of the sequence,
    # even) between.
    cfg = _config(
        "ModernBertConfig", vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=2 * dim,
        max_position_embeddings=max(seq, 128), local_attention=2 * _window(dim, heads, seq),
        global_attn_every_n_layers=2, attn_implementation="sdpa", pad_token_id=0,
        bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
    )  # fmt: skip
    return _model("ModernBertForMaskedLM", cfg)


def _stages(layers: int) -> list[int]:
    """Two stages of a hierarchical vision model (the second at half the resolution and
    twice the width); at least one layer each."""
    return [max(1, layers - layers // 2), max(1, layers // 2)]


def _swin(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Windows of at most 8 x 8 patches that fit the second stage (2 x 2 at seq 16; a
    # window larger than the stage makes Swin's position bias the wrong size).
    size = _image_size(seq)
    cfg = _config(
        "SwinConfig", image_size=size, patch_size=16, embed_dim=dim // 2, depths=_stages(layers),
        num_heads=[max(1, heads // 2), heads], window_size=max(1, min(8, size // 32)),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
        num_labels=1000,
    )  # fmt: skip
    return _model("SwinForImageClassification", cfg)


def _convnext(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "ConvNextConfig", image_size=_image_size(seq), patch_size=16, num_stages=2,
        hidden_sizes=[dim // 2, dim], depths=_stages(layers), drop_path_rate=0.0,
        num_labels=1000,
    )  # fmt: skip
    return _model("ConvNextForImageClassification", cfg)


def _deit(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    cfg = _config(
        "DeiTConfig", hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * dim, image_size=_image_size(seq), patch_size=16, num_labels=1000,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return _model("DeiTForImageClassification", cfg)


def _segformer(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # SegFormer's own strides (4, then 2): its first stage sees 16 positions per patch of
    # the others' images, its keys reduced 4x (sr_ratios) as in its checkpoints.
    cfg = _config(
        "SegformerConfig", num_encoder_blocks=2, depths=_stages(layers), sr_ratios=[4, 2],
        hidden_sizes=[dim // 2, dim], patch_sizes=[7, 3], strides=[4, 2],
        num_attention_heads=[max(1, heads // 2), heads], mlp_ratios=[4, 4],
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
        drop_path_rate=0.0, decoder_hidden_size=dim, num_labels=16,
    )  # fmt: skip
    return _model("SegformerForSemanticSegmentation", cfg)


def _vision_tower(config: str, model: str) -> Callable[..., torch.nn.Module]:
    """CLIP's or SigLIP's vision tower with an image-classification head (logits: a loss on
    the tower's normalized output alone is about 1 whatever the weights, and its gradients
    are rounding noise)."""

    def build(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
        vision = dict(
            hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers,
            num_attention_heads=heads, image_size=_image_size(seq), patch_size=16,
            attention_dropout=0.0,
        )  # fmt: skip
        cfg = _config(config, vision_config=vision, num_labels=1000)
        cfg._attn_implementation = "sdpa"
        return _model(model, cfg)

    return build


def _wav2vec2(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Two feature-extractor convolutions of total stride 10 (`_samples`: `seq` frames); a
    # weight-normed convolution for positions.
    cfg = _config(
        "Wav2Vec2Config", vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * dim, conv_dim=(dim, dim),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=heads, hidden_dropout=0.0, activation_dropout=0.0,
        attention_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0, final_dropout=0.0,
        mask_time_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return _model("Wav2Vec2ForCTC", cfg)


def _samples(seq: int) -> int:
    """Audio samples that `_wav2vec2`'s feature extractor turns into `seq` frames."""
    return 10 * seq + 10


# -- the second survey's architectures (2026-11-29) ----------------------------------------


def _zamba2(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Mamba2 layers, and every second one a hybrid: one transformer block shared by all the
    # hybrid layers (its input concatenated with the embeddings) with a LoRA adapter per
    # layer; transformers' pure-torch scan (no mamba_ssm kernels).
    cfg = _config(
        "Zamba2Config", vocab_size=vocab, hidden_size=dim, num_hidden_layers=layers,
        layers_block_type=["linear_attention", "hybrid"] * (layers // 2)
        + ["linear_attention"] * (layers % 2),
        num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=4 * dim,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=heads,
        chunk_size=min(256, max(8, seq // 2)), num_mem_blocks=1,
        use_shared_attention_adapter=True, adapter_rank=max(1, dim // 8),
        max_position_embeddings=max(seq, 128), use_cache=False, attn_implementation="sdpa",
    )  # fmt: skip
    return _model("Zamba2ForCausalLM", cfg)


def _switch(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # T5 with top-1 routed experts every second layer, capacity-limited (tokens past an
    # expert's capacity skip it); no router jitter (random in training).
    cfg = _config(
        "SwitchTransformersConfig", vocab_size=vocab, d_model=dim, d_kv=dim // heads,
        d_ff=4 * dim, num_layers=layers, num_decoder_layers=layers,
        num_sparse_encoder_layers=max(1, layers // 2),
        num_sparse_decoder_layers=max(1, layers // 2), num_heads=heads, num_experts=4,
        expert_capacity=max(seq, _DECODER_TOKENS), router_jitter_noise=0.0, dropout_rate=0.0,
        decoder_start_token_id=0, use_cache=False,
    )  # fmt: skip
    return _model("SwitchTransformersForConditionalGeneration", cfg)


def _dinov2(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Position embeddings for an image twice the input's size, bicubically interpolated to
    # the input's patches at every call (DINOv2's checkpoints: 518 pixels, run at 224);
    # layer scale.
    cfg = _config(
        "Dinov2Config", hidden_size=dim, num_hidden_layers=layers, num_attention_heads=heads,
        mlp_ratio=4, image_size=2 * _image_size(seq), patch_size=16, num_labels=1000,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
        attn_implementation="sdpa",
    )  # fmt: skip
    return _model("Dinov2ForImageClassification", cfg)


def _resnet(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Basic blocks, batch norm in training mode: every step updates its running statistics
    # (buffers) and the inference logits use them.
    cfg = _config(
        "ResNetConfig", embedding_size=dim // 2, hidden_sizes=[dim // 2, dim],
        depths=_stages(layers), layer_type="basic", num_labels=1000,
    )  # fmt: skip
    return _model("ResNetForImageClassification", cfg)


def _speech2text(layers: int, dim: int, heads: int, vocab: int, seq: int) -> torch.nn.Module:
    # Two strided 1-d convolutions with GLU (4x subsampling: `_speech_frames`), sinusoidal
    # positions, a BART-like encoder-decoder.
    cfg = _config(
        "Speech2TextConfig", vocab_size=vocab, d_model=dim, encoder_layers=layers,
        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=4 * dim, decoder_ffn_dim=4 * dim, conv_channels=2 * dim,
        input_feat_per_channel=_SPEECH_FEATURES, max_source_positions=max(seq, 128),
        max_target_positions=max(_DECODER_TOKENS, 128), dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, decoder_start_token_id=0, use_cache=False,
        attn_implementation="eager",  # no SDPA path
    )  # fmt: skip
    return _model("Speech2TextForConditionalGeneration", cfg)


_SPEECH_FEATURES = 80  # Speech2Text's filterbank features a frame


def _speech_frames(seq: int) -> int:
    """Input frames that `_speech2text`'s convolutions turn into `seq` encoder positions."""
    return 4 * seq


# The survey's Llama-like decoders: config class, model class, what differs from Llama.
_DECODERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": _head}),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "head_dim": _head, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": _twice, "decoder_sparse_step": 1, "mlp_only_layers": []}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {
        "hidden_dropout": 0.0, "attention_dropout": 0.0}),
    "phi": ("PhiConfig", "PhiForCausalLM", {
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
        "partial_rotary_factor": 0.5}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {
        "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "granite-moe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {"partial_rotary_factor": 0.5}),
    "persimmon": ("PersimmonConfig", "PersimmonForCausalLM", {
        "num_key_value_heads": None, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "partial_rotary_factor": 0.5}),
    # pad_token_id below the vocabulary (the default, 151329, is not)
    "glm": ("GlmConfig", "GlmForCausalLM", {
        "head_dim": _head, "pad_token_id": 0, "eos_token_id": 1}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {
        "head_dim": _head, "pad_token_id": 0, "eos_token_id": 1}),
    # Multi-head latent attention (all heads for keys and values), a dense first layer,
    # shared and routed experts.
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_key_value_heads": _heads, "moe_intermediate_size": _twice, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "kv_lora_rank": _half, "q_lora_rank": _half,
        "qk_rope_head_dim": _head, "v_head_dim": _head, "qk_nope_head_dim": _head}),
    # Mamba and attention layers alternating, experts every second layer; transformers'
    # pure-torch scan (no mamba_ssm kernels).
    "jamba": ("JambaConfig", "JambaForCausalLM", {
        "num_experts": 2, "num_experts_per_tok": 1, "expert_layer_period": 2,
        "expert_layer_offset": 1, "attn_layer_period": 2, "attn_layer_offset": 1,
        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
        "mamba_dt_rank": _dt_rank}),
    # The second survey's (2026-11-29).
    # 4 experts, 2 a token, query and key norms, no shared expert.
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0, "eos_token_id": 1}),
    # Gated short convolutions (a causal depthwise conv1d of 3) and attention alternating.
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", {"full_attn_idxs": list(range(1, 64, 2))}),
    # Gated delta rule linear attention (transformers' pure-torch chunked form, a causal
    # conv1d before it) and gated full attention alternating; shared and routed experts.
    "qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", {
        "head_dim": _head, "full_attention_interval": 2, "linear_num_key_heads": _half_heads,
        "linear_num_value_heads": _heads, "linear_key_head_dim": _head,
        "linear_value_head_dim": _head, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": _twice, "shared_expert_intermediate_size": _twice}),
    # Chunked attention (a quarter of the sequence) with RoPE, global attention without
    # (NoPE, temperature-tuned) alternating; a dense layer, then a top-1 expert with a
    # shared one; L2-normed queries and keys.
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {
        "head_dim": _head, "no_rope_layer_interval": 2, "attention_chunk_size": _window,
        "interleave_moe_layer_step": 2, "num_local_experts": 4, "num_experts_per_tok": 1,
        "intermediate_size": _twice, "intermediate_size_mlp": _twice}),
    # Every second layer without rotary positions (NoPE).
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {
        "no_rope_layer_interval": 2, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # A dense first layer, then shared and routed experts (a correction bias in routing).
    "ernie4.5-moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", {
        "moe_num_experts": 4, "moe_k": 2, "moe_num_shared_experts": 1,
        "moe_intermediate_size": _twice, "moe_layer_start_index": 1}),
}  # fmt: skip


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
    # The survey's (python -m bench.survey): 39 architectures nobody here had tried.
    **{f"hf-{name}": Arch(_decoder(c, m, **x)) for name, (c, m, x) in _DECODERS.items()},
    "hf-gptj": Arch(_gptj),
    "hf-gpt-neo": Arch(_gpt_neo),
    "hf-codegen": Arch(_codegen),
    "hf-bloom": Arch(_bloom),
    "hf-mpt": Arch(_mpt),
    "hf-dbrx": Arch(_dbrx),
    "hf-mamba2": Arch(_mamba2),
    "hf-recurrent-gemma": Arch(_recurrent_gemma),
    "hf-bart": Arch(_seq2seq("BartConfig", "BartForConditionalGeneration"), "seq2seq"),
    "hf-marian": Arch(
        _seq2seq("MarianConfig", "MarianMTModel", decoder_start_token_id=0, pad_token_id=1),
        "seq2seq",
    ),
    "hf-distilbert": Arch(_distilbert),
    "hf-roberta": Arch(_encoder("RobertaConfig", "RobertaForMaskedLM", attn_implementation="sdpa")),
    "hf-albert": Arch(
        _encoder(
            "AlbertConfig", "AlbertForMaskedLM", embedding_size=_half, classifier_dropout_prob=0.0
        )
    ),
    "hf-electra": Arch(
        _encoder(
            "ElectraConfig", "ElectraForMaskedLM", embedding_size=_half, attn_implementation="sdpa"
        )
    ),
    # Disentangled relative attention, log buckets over a quarter of the sequence.
    "hf-deberta-v2": Arch(
        _encoder(
            "DebertaV2Config",
            "DebertaV2ForMaskedLM",
            relative_attention=True,
            position_buckets=_window,
            max_relative_positions=_seq,
            pos_att_type=["p2c", "c2p"],
        )
    ),
    "hf-modernbert": Arch(_modernbert),
    "hf-swin": Arch(_swin, "pixels"),
    "hf-convnext": Arch(_convnext, "pixels"),
    "hf-deit": Arch(_deit, "pixels"),
    "hf-segformer": Arch(_segformer, "pixels"),
    "hf-clip": Arch(_vision_tower("CLIPConfig", "CLIPForImageClassification"), "pixels"),
    "hf-siglip": Arch(_vision_tower("SiglipConfig", "SiglipForImageClassification"), "pixels"),
    "hf-wav2vec2": Arch(_wav2vec2, "waveform"),
    # The second survey's (2026-11-29): 13 more with its six decoders in `_DECODERS`.
    "hf-zamba2": Arch(_zamba2),
    "hf-switch-transformers": Arch(_switch, "seq2seq"),
    # Sliding-window attention in overlapping chunks (a window of half the sequence;
    # Longformer has no SDPA path).
    "hf-longformer": Arch(
        _encoder("LongformerConfig", "LongformerForMaskedLM", attention_window=_half_seq)
    ),
    # Relative position buckets (T5's) added to every layer's scores.
    "hf-mpnet": Arch(_encoder("MPNetConfig", "MPNetForMaskedLM")),
    "hf-dinov2": Arch(_dinov2, "pixels"),
    "hf-resnet": Arch(_resnet, "pixels"),
    "hf-speech2text": Arch(_speech2text, "speech"),
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
    if kind == "waveform":
        return {"input_values": torch.randn(batch, _samples(seq), generator=generator)}
    if kind == "speech":
        frames = torch.randn(batch, _speech_frames(seq), _SPEECH_FEATURES, generator=generator)
        return {
            "input_features": frames,
            "decoder_input_ids": _ids(cfg.vocab_size, batch, _DECODER_TOKENS, generator),
        }
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
