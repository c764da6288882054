"""Small decoder-only transformers: a Llama-style and a GPT-style one.

They are written the way users write such models (one Python class per block, the
blocks in an nn.ModuleList), so that capture sees the repeated layers unrolled, exactly
as it would in a real training script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Shape of an example model. `family` is "llama" or "gpt"."""

    family: str = "llama"
    layers: int = 2
    dim: int = 64
    heads: int = 4
    vocab: int = 256
    max_seq: int = 128
    ffn_mult: float = 8 / 3

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def ffn_dim(self) -> int:
        # Llama rounds the SwiGLU width up to a multiple of 32; GPT uses 4x.
        if self.family == "gpt":
            return 4 * self.dim
        return 32 * math.ceil(self.ffn_mult * self.dim / 32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


def rope_tables(cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq).float(), inv)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, heads, seq, head_dim); rotate pairs (even, odd) of the last dim.
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=cfg.family == "gpt")
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.family == "gpt")

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (
            y.view(b, t, self.cfg.heads, self.cfg.head_dim).transpose(1, 2) for y in (q, k, v)
        )
        if rope is not None:
            cos, sin = rope[0][:t], rope[1][:t]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class GeluMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.dim, cfg.ffn_dim)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        llama = cfg.family == "llama"
        self.norm1: nn.Module = RMSNorm(cfg.dim) if llama else nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.norm2: nn.Module = RMSNorm(cfg.dim) if llama else nn.LayerNorm(cfg.dim)
        self.mlp: nn.Module = SwiGLU(cfg) if llama else GeluMLP(cfg)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.family not in ("llama", "gpt"):
            raise ValueError(f"family must be 'llama' or 'gpt', got {cfg.family!r}")
        if cfg.dim % cfg.heads:
            raise ValueError(f"dim {cfg.dim} is not a multiple of heads {cfg.heads}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos = nn.Embedding(cfg.max_seq, cfg.dim) if cfg.family == "gpt" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm: nn.Module = RMSNorm(cfg.dim) if cfg.family == "llama" else nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.family == "llama":
            cos, sin = rope_tables(cfg)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        rope = None
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        else:
            rope = (self.rope_cos, self.rope_sin)
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.norm(x))


def build(cfg: ModelConfig, seed: int = 0) -> Decoder:
    """The model with deterministic weights (same seed -> same parameters)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Decoder(cfg)


def sample_tokens(cfg: ModelConfig, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (batch, seq), generator=gen)
