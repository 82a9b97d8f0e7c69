"""Rotary position embeddings: each RoPE type's frequencies, and ``(cos, sin)`` of positions.

The frequency formulas are transformers' (``modeling_rope_utils``), so a checkpoint rotates its
queries and keys exactly as it was trained to; tests/sharding/test_families.py compares every type's
frequencies and attention factor with transformers' own.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import Llama3RopeScaling, ModelConfig, RopeScaling


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim // 2] fp32, attention_factor)`` of full-attention layers, or of sliding
    layers with ``local`` (their own base, no scaling: Gemma 3)."""
    dim = cfg.rotary_dim
    theta = cfg.local_rope_theta if local and cfg.local_rope_theta is not None else cfg.rope_theta
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (theta ** exponents)
    s = None if local and cfg.local_rope_theta is not None else cfg.rope_scaling
    if s is None:
        return inv_freq, 1.0
    if isinstance(s, Llama3RopeScaling):
        return _llama3(inv_freq, s), 1.0
    if s.kind == "linear":
        return inv_freq / s.factor, 1.0
    if s.kind == "yarn":
        return _yarn(cfg, s, theta, dim)
    return _longrope(cfg, s, theta, exponents)


def _llama3(inv_freq: torch.Tensor, s: Llama3RopeScaling) -> torch.Tensor:
    # Llama 3.x: keep short wavelengths, divide long ones by `factor`, blend the band between.
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(cfg: ModelConfig, s: RopeScaling, base: float, dim: int) -> tuple[torch.Tensor, float]:
    factor, original = s.factor, s.original_max_position_embeddings

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.attention_factor
    if attention is None:
        attention = (float(mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim))
                     if s.mscale and s.mscale_all_dim else mscale(factor))
    beta_fast, beta_slow = s.beta_fast or 32, s.beta_slow or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention)


def _longrope(cfg: ModelConfig, s: RopeScaling, base: float, exponents: torch.Tensor) -> tuple[torch.Tensor, float]:
    original = s.original_max_position_embeddings
    factor = s.factor if s.factor is not None else cfg.max_position_embeddings / original
    attention = s.attention_factor
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    # Sequences within the pre-training context (all fastmode serves: ModelConfig.context) use short_factor.
    ext = torch.tensor(s.short_factor, dtype=torch.float32)
    return 1.0 / (ext * base ** exponents), float(attention)


class RotaryEmbedding(nn.Module):
    """``(cos, sin)`` of each token's position, computed on the fly (no table to size)."""

    def __init__(self, cfg: ModelConfig, local: bool = False) -> None:
        super().__init__()
        inv_freq, self.attention_factor = rope_inv_freq(cfg, local)
        # fp32 on purpose: build the model in its final dtype rather than calling `.to(dtype)` later.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, S] -> cos, sin: [B, S, 1, rotary_dim] (broadcast over heads)
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: [B, S, H, head_dim]`` (rotate-half, as HF checkpoints); with partial rotary only the
    first ``cos.shape[-1]`` dimensions turn and the rest pass through."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
