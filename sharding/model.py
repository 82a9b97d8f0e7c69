"""A plain-torch Llama decoder whose pipeline stages are the same model with layers removed.

Parameter names are Hugging Face's (``model.embed_tokens.weight``, ``model.layers.{i}...``,
``model.norm.weight``, ``lm_head.weight``), with ``i`` the *global* layer index, so one loader
serves the whole model, every pipeline stage and every tensor-parallel rank.

Batch layout: ``[B, S]``, one row per sequence. Row ``b`` holds ``S`` consecutive tokens of the
sequence in KV-cache slot ``slots[b]`` at ``positions[b]``. Prefill is ``S = prompt length``,
decode is ``S = 1`` over many rows; both take the same path: write this step's keys and values
into the cache, then attend over the slot's cached positions ``<=`` the query's. Rows of
different lengths are right-padded with any token at the *continuing* positions: the padding
writes cache entries past the sequence's end, which the sequence overwrites before it reads them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .errors import InvalidLayout
from .kv_cache import KVCache


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies ``[head_dim // 2]`` in fp32, as transformers computes them."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
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


class RotaryEmbedding(nn.Module):
    """``(cos, sin)`` of each token's position, computed on the fly (no table to size)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # fp32 on purpose: build the model in its final dtype rather than calling `.to(dtype)` later.
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [B, S] -> cos, sin: [B, S, 1, head_dim] (broadcast over heads)
        freqs = positions[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x: [B, S, H, head_dim]`` (the rotate-half convention of HF Llama checkpoints)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 like transformers."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention over the KV cache.

    ``num_heads``/``num_kv_heads`` are the heads *this module* computes: tensor parallelism
    swaps the projections and divides both (``sharding.tp.apply_tp``).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D]; k_cache, v_cache: [num_slots, max_len, kv_heads, head_dim]; mask: [B, 1, S, span]
        B, S, _ = x.shape
        span = mask.shape[-1]
        q = apply_rope(self.q_proj(x).view(B, S, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, S, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(B, S, self.num_kv_heads, self.head_dim)
        row_slots = slots[:, None].expand(B, S)
        k_cache.index_put_((row_slots, positions), k)
        v_cache.index_put_((row_slots, positions), v)
        # Only the first `span` positions can be attended; index_select copies far less than
        # indexing the whole slot (and is much faster than advanced indexing on CPU).
        keys = k_cache[:, :span].index_select(0, slots)  # [B, span, kv_heads, head_dim]
        values = v_cache[:, :span].index_select(0, slots)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask, scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, S, head_dim]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, slots, k_cache, v_cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """The ``model.`` prefix of HF names: embedding (first stage), owned layers, final norm (last stage)."""

    def __init__(self, cfg: ModelConfig, layer_range: tuple[int, int], has_embedding: bool,
                 has_head: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if has_embedding else None
        # Keyed by global index so a stage's parameter names match the checkpoint's.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg) for i in range(*layer_range)})
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if has_head else None


class Llama(nn.Module):
    """A Llama decoder, or one pipeline stage of it.

    Args:
        config: the model's shape.
        layer_range: ``(start, stop)``, the global indices of the decoder layers this model owns
            (default: all).
        has_embedding: owns the token embedding, i.e. takes token ids (default: ``start == 0``).
        has_head: owns the final norm and output head, i.e. yields logits (default:
            ``stop == num_layers``).
        dtype, device: of parameters. Weights are *uninitialised* (built on the meta device, then
            materialised) until ``sharding.weights.load_weights``.
    """

    def __init__(self, config: ModelConfig, *, layer_range: tuple[int, int] | None = None,
                 has_embedding: bool | None = None, has_head: bool | None = None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        start, stop = layer_range if layer_range is not None else (0, config.num_layers)
        if not 0 <= start <= stop <= config.num_layers:
            raise InvalidLayout(f"layer_range ({start}, {stop}) is not within [0, {config.num_layers}]")
        self.config = config
        self.layer_range = (start, stop)
        self.has_embedding = start == 0 if has_embedding is None else has_embedding
        self.has_head = stop == config.num_layers if has_head is None else has_head
        if start == stop and not (self.has_embedding or self.has_head):
            raise InvalidLayout("a model with no layers, no embedding and no head does nothing")
        with torch.device("meta"):
            self.model = LlamaBody(config, self.layer_range, self.has_embedding, self.has_head)
            self.lm_head = (nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                            if self.has_head else None)
        self.to(dtype=dtype).to_empty(device=device)
        if config.tie_word_embeddings and self.has_embedding and self.has_head:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.requires_grad_(False)
        self.rotary = RotaryEmbedding(config).to(device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: KVCache, span: int | None = None) -> torch.Tensor:
        """Run the owned layers on one batch, reading and writing ``cache``.

        Args:
            x: token ids ``[B, S]`` (long) if this model has the embedding, else the previous
                stage's hidden states ``[B, S, D]``.
            positions: ``[B, S]`` (long), each token's position in its sequence.
            slots: ``[B]`` (long), each row's KV-cache slot.
            cache: this model's cache (``KVCache.for_model``).
            span: attend over cache positions ``< span`` only; must exceed every position in
                ``positions`` (default: the cache's ``max_len``). Reading less of the cache is
                most of a decode step's attention cost (see ``sharding.stage.span_for``).

        Returns:
            Hidden states ``[B, S, D]``: after the final norm on the last stage (feed them to
            ``compute_logits``), otherwise the input of the next stage.
        """
        h = self.model.embed_tokens(x) if self.has_embedding else x
        cos, sin = self.rotary(positions, h.dtype)
        span = cache.max_len if span is None else span
        # Once per step, not per layer: key position j is visible to a query at position p iff j <= p.
        # Additive, in the activations' dtype: SDPA would convert a boolean mask in every layer.
        visible = torch.arange(span, device=positions.device) <= positions[:, :, None]  # [B, S, span]
        mask = torch.zeros(visible.shape, dtype=h.dtype, device=h.device).masked_fill_(
            ~visible, float("-inf"))[:, None]  # [B, 1, S, span]
        for j, layer in enumerate(self.model.layers.values()):
            h = layer(h, cos, sin, positions, slots, cache.k[j], cache.v[j], mask)
        return self.model.norm(h) if self.has_head else h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` of normed hidden states ``[..., D]`` (last stage only)."""
        if self.lm_head is None:
            raise InvalidLayout("compute_logits needs the stage that has the head")
        return self.lm_head(hidden)
