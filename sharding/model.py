"""A plain-torch decoder (Llama and the families of ``sharding.config``) whose pipeline stages are
the same model with layers removed.

The families differ only in small pieces chosen from the config: biases on projections, a
per-head q/k norm, the norm's ``(offset + w)``, the MLP's activation, an embedding scale, Gemma 3's
four norms per layer, sliding-window layers and their own RoPE base, partial rotary. Phi-3's fused
projections are split at load (``sharding.weights``), so the model never sees them.

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

from .config import SLIDING, ModelConfig
from .errors import InvalidLayout
from .kv_cache import KVCache
from .rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 like transformers; Gemma's ``offset=1`` multiplies by
    ``1 + w`` in fp32 before casting back (transformers' Gemma3RMSNorm), Llama's by ``w`` after."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)


def _norm(cfg: ModelConfig, dim: int | None = None) -> RMSNorm:
    return RMSNorm(cfg.hidden_size if dim is None else dim, cfg.rms_norm_eps, cfg.norm_offset)


class Attention(nn.Module):
    """Grouped-query attention over the KV cache.

    ``num_heads``/``num_kv_heads`` are the heads *this module* computes: tensor parallelism
    swaps the projections and divides both (``sharding.tp.apply_tp``).
    """

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim ** -0.5
        self.sliding = cfg.layer_type(layer) == SLIDING
        self.window = cfg.sliding_window if self.sliding else 0
        self.kernel = None
        """``fastmode::cached_attention`` where set (``sharding.cached_attention``): the cache is read in
        place and no mask is needed; otherwise each row's span is gathered and SDPA attends."""
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=cfg.o_bias)
        self.q_norm = _norm(cfg, hd) if cfg.qk_norm else None
        self.k_norm = _norm(cfg, hd) if cfg.qk_norm else None
        self.qkv = None
        """q, k and v in one call where set (``sharding.packed.FusedLinears``); else three."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                mask: torch.Tensor | None, span: int) -> torch.Tensor:
        # x: [B, S, D]; k_cache, v_cache: [num_slots, max_len, kv_heads, head_dim]; mask: [B, 1, S, span],
        # or None for SDPA's causal path or the kernel (which needs none); span: cache positions read
        B, S, _ = x.shape
        q, k, v = self.qkv(x) if self.qkv is not None else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = q.view(B, S, self.num_heads, self.head_dim)
        k = k.view(B, S, self.num_kv_heads, self.head_dim)
        v = v.view(B, S, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        row_slots = slots[:, None].expand(B, S)
        k_cache.index_put_((row_slots, positions), k)
        v_cache.index_put_((row_slots, positions), v)
        if self.kernel is not None:
            out = self.kernel(q, k_cache, v_cache, slots, positions, span, self.window, self.scale)  # [B, S, H, hd]
            return self.o_proj(out.view(B, S, self.num_heads * self.head_dim))
        span = span_of(mask, S)
        # Only the first `span` positions can be attended; index_select copies far less than
        # indexing the whole slot (and is much faster than advanced indexing on CPU).
        keys = k_cache[:, :span].index_select(0, slots)  # [B, span, kv_heads, head_dim]
        values = v_cache[:, :span].index_select(0, slots)
        # mask None: every row is a prompt from position 0, so query i sees keys 0..i: SDPA's own causal
        # path (top-left aligned; keys past S in the span are never seen), no [B, 1, S, span] mask.
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [B, H, S, head_dim]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``; SwiGLU (``silu``) or GeGLU (``gelu_pytorch_tanh``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = F.silu if cfg.hidden_act == "silu" else _gelu_tanh
        self.gate_up = None
        """gate and up in one call where set (``sharding.packed.FusedLinears``); else two."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; with ``sandwich_norm``
    (Gemma 3) each branch's output is normed too before it joins the residual."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = _norm(cfg)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = _norm(cfg)
        self.pre_feedforward_layernorm = _norm(cfg) if cfg.sandwich_norm else None
        self.post_feedforward_layernorm = _norm(cfg) if cfg.sandwich_norm else None
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                mask: torch.Tensor | None, span: int) -> torch.Tensor:
        a = self.self_attn(self.input_layernorm(x), cos, sin, positions, slots, k_cache, v_cache, mask, span)
        if self.pre_feedforward_layernorm is None:
            x = x + a
            return x + self.mlp(self.post_attention_layernorm(x))
        x = x + self.post_attention_layernorm(a)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class LlamaBody(nn.Module):
    """The ``model.`` prefix of HF names: embedding (first stage), owned layers, final norm (last stage)."""

    def __init__(self, cfg: ModelConfig, layer_range: tuple[int, int], has_embedding: bool,
                 has_head: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if has_embedding else None
        # Keyed by global index so a stage's parameter names match the checkpoint's.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, i) for i in range(*layer_range)})
        self.norm = _norm(cfg) if has_head else None


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
        sliding = [layer.self_attn.sliding for layer in self.model.layers.values()]
        self.has_sliding = any(sliding)
        self.needs_masks = True
        """Whether a step builds attention masks: not once every layer attends through
        ``sharding.cached_attention`` (which reads positions and windows itself)."""
        self.local_rotary = (RotaryEmbedding(config, local=True).to(device)
                             if self.has_sliding and config.local_rope_theta is not None else None)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: KVCache, span: int | None = None, causal: bool = False) -> torch.Tensor:
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
            causal: every row is a prompt from position 0 (``positions[b] = 0 .. S-1``, no cached
                prefix): full-attention layers use SDPA's causal path and no mask is built
                (``sharding.stage.StageRunner.forward`` knows this from the rows).

        Returns:
            Hidden states ``[B, S, D]``: after the final norm on the last stage (feed them to
            ``compute_logits``), otherwise the input of the next stage.
        """
        if self.has_embedding:
            h = self.model.embed_tokens(x)
            if self.config.embed_scale != 1.0:  # in the weights' dtype, as transformers' Gemma
                h = h * torch.tensor(self.config.embed_scale, dtype=h.dtype)
        else:
            h = x
        cos, sin = self.rotary(positions, h.dtype)
        local = self.local_rotary(positions, h.dtype) if self.local_rotary is not None else (cos, sin)
        span = cache.max_len if span is None else span
        # Once per step, not per layer: key position j is visible to a query at position p iff j <= p
        # (and, in a sliding layer, j > p - sliding_window). Additive, in the activations' dtype: SDPA
        # would convert a boolean mask in every layer.
        mask = window = None
        if self.needs_masks and (not causal or self.has_sliding):
            keys = torch.arange(span, device=positions.device)
            visible = keys <= positions[:, :, None]  # [B, S, span]
            if not causal:
                mask = _additive(visible, h)
            if self.has_sliding:
                window = _additive(visible & (keys > positions[:, :, None] - self.config.sliding_window), h)
        if not self.has_sliding:
            window = mask
        for j, layer in enumerate(self.model.layers.values()):
            if layer.self_attn.sliding:
                h = layer(h, *local, positions, slots, cache.k[j], cache.v[j], window, span)
            else:
                h = layer(h, cos, sin, positions, slots, cache.k[j], cache.v[j], mask, span)
        return self.model.norm(h) if self.has_head else h

    def decode_logits(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                      cache: KVCache, span: int | None = None, causal: bool = False) -> torch.Tensor:
        """``forward`` and ``compute_logits`` of a step with one token per row (``x``: ``[B, 1]``
        ids or ``[B, 1, D]`` hidden states): logits ``[B, vocab]``. One call, so a compiled model
        enters one graph per decode step, not two (last stage only)."""
        return self.decode_hidden_logits(x, positions, slots, cache, span, causal)[0]

    def decode_hidden_logits(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                             cache: KVCache, span: int | None = None,
                             causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode_logits``, and the normed hidden states ``[B, D]`` the head read (a cut head's
        per-request rows multiply them: ``sharding.draft_vocab.PromptRows``)."""
        h = self.forward(x, positions, slots, cache, span, causal)[:, 0]
        return self.compute_logits(h), h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` of normed hidden states ``[..., D]`` (last stage only)."""
        if self.lm_head is None:
            raise InvalidLayout("compute_logits needs the stage that has the head")
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def span_of(mask: torch.Tensor | None, fallback: int) -> int:
    """Cache positions a layer reads: the mask's width, or ``fallback`` (the step's length) on the causal path."""
    return fallback if mask is None else mask.shape[-1]


def _additive(visible: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B, S, span]`` visibility as an additive ``[B, 1, S, span]`` mask in ``like``'s dtype."""
    return torch.zeros(visible.shape, dtype=like.dtype, device=like.device).masked_fill_(
        ~visible, float("-inf"))[:, None]
