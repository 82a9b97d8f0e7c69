"""``ModelConfig``: the shape of a decoder-only checkpoint, read from a Hugging Face ``config.json``.

Six families share one plain-torch decoder (``sharding.model``); what differs between them is a
handful of fields here, each read from the family's own ``config.json`` spelling:

============  =========================================================================
family        what differs from Llama
============  =========================================================================
llama         (Llama 1/2/3.x, SmolLM2) optional ``attention_bias``/``mlp_bias``
qwen2         q/k/v projections carry biases
qwen3         per-head RMSNorm of queries and keys before RoPE (``qk_norm``)
mistral       sliding-window attention when ``sliding_window`` is set
gemma3_text   (and ``gemma3``'s text part) ``(1 + w)`` RMSNorm, GeLU-tanh, embeddings scaled
              by ``sqrt(hidden_size)``, four norms per layer, qk-norm, ``query_pre_attn_scalar``,
              sliding/full layers with their own RoPE base
phi3          fused ``qkv_proj``/``gate_up_proj`` (split at load), partial rotary, ``longrope``
============  =========================================================================

Both spellings of RoPE settings are accepted: the transformers 4 one (top-level ``rope_theta``
plus ``rope_scaling``) and the transformers 5 one (``rope_parameters``, which carries
``rope_theta`` inside it and is what ``save_pretrained`` writes today). RoPE types ``default``,
``llama3``, ``linear``, ``yarn`` and ``longrope`` are implemented (``sharding.rope``); ``dynamic``
and anything else are refused by name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidConfig

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "phi3")
"""``model_type`` values the executor runs (``gemma3`` checkpoints run as their ``gemma3_text`` part)."""

FULL, SLIDING = "full_attention", "sliding_attention"
"""The two attention kinds of ``ModelConfig.layer_types`` (transformers' names)."""

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True, kw_only=True)
class Llama3RopeScaling:
    """Llama-3.x RoPE frequency scaling (``rope_type: "llama3"``)."""

    factor: float
    """Long wavelengths are divided by this (``8`` in Llama 3.1)."""
    low_freq_factor: float
    """Wavelengths above ``original_max_position_embeddings / low_freq_factor`` are fully scaled."""
    high_freq_factor: float
    """Wavelengths below ``original_max_position_embeddings / high_freq_factor`` are untouched."""
    original_max_position_embeddings: int
    """Context length the model was pre-trained with before scaling."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise InvalidConfig(f"llama3 rope scaling: factor must be > 0, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise InvalidConfig(
                "llama3 rope scaling: need 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}")
        if self.original_max_position_embeddings < 1:
            raise InvalidConfig("llama3 rope scaling: original_max_position_embeddings must be >= 1, got "
                                f"{self.original_max_position_embeddings}")


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """``linear``, ``yarn`` or ``longrope`` RoPE scaling, with transformers' field names and defaults."""

    kind: str
    """``"linear"`` (positions divided by ``factor``), ``"yarn"`` or ``"longrope"``."""
    factor: float | None = None
    """Context extension factor (longrope: default ``max_position_embeddings / original``)."""
    original_max_position_embeddings: int | None = None
    """Pre-training context (yarn, longrope)."""
    attention_factor: float | None = None
    """Scale of cos/sin (yarn, longrope); default: each method's own formula."""
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    """yarn's correction range rounded to whole dimensions."""
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    """longrope's per-frequency factors; fastmode uses ``short_factor`` and serves at most
    ``original_max_position_embeddings`` positions (``ModelConfig.context``), which is what
    transformers computes for every sequence that fits them."""

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "yarn", "longrope"):
            raise InvalidConfig(f"rope_type {self.kind!r} is not a RopeScaling kind")
        if self.kind in ("linear", "yarn") and not (self.factor and self.factor > 0):
            raise InvalidConfig(f"{self.kind} rope scaling needs factor > 0, got {self.factor}")
        if self.kind in ("yarn", "longrope") and not self.original_max_position_embeddings:
            raise InvalidConfig(f"{self.kind} rope scaling lacks original_max_position_embeddings")
        if self.kind == "longrope" and (self.short_factor is None or self.long_factor is None):
            raise InvalidConfig("longrope rope scaling lacks short_factor/long_factor")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder's hyper-parameters; every field mirrors one ``config.json`` field (or a family's fixed
    choice, see the module docstring). The defaults are Llama's."""

    model_type: str = "llama"
    """The family (one of ``FAMILIES``)."""
    vocab_size: int
    """Rows of the embedding and of the output head."""
    hidden_size: int
    """Residual stream width ``D``."""
    intermediate_size: int
    """Gated MLP hidden width."""
    num_layers: int
    """Decoder blocks (``num_hidden_layers``)."""
    num_heads: int
    """Query heads (``num_attention_heads``)."""
    num_kv_heads: int
    """Key/value heads (``num_key_value_heads``); grouped-query attention when < ``num_heads``."""
    head_dim: int
    """Width of one attention head (``head_dim``, else ``hidden_size // num_heads``)."""
    rms_norm_eps: float
    """Epsilon inside every RMSNorm."""
    rope_theta: float
    """RoPE base wavelength (of full-attention layers)."""
    rope_scaling: Llama3RopeScaling | RopeScaling | None = None
    """Frequency scaling of full-attention layers, or ``None`` for plain RoPE."""
    partial_rotary_factor: float = 1.0
    """Fraction of each head's dimensions RoPE rotates (the first ones; Phi-3.5/4-mini: 0.75)."""
    local_rope_theta: float | None = None
    """RoPE base of sliding-window layers when it differs (Gemma 3's ``rope_local_base_freq``)."""
    max_position_embeddings: int
    """Context window: positions ``0 .. max_position_embeddings - 1``."""
    tie_word_embeddings: bool
    """The output head shares the input embedding's weight."""
    hidden_act: str = "silu"
    """The gated MLP's activation: ``silu`` (SwiGLU) or ``gelu_pytorch_tanh`` (GeGLU, Gemma)."""
    qkv_bias: bool = False
    """The q/k/v projections have biases (Qwen2; Llama's ``attention_bias``)."""
    o_bias: bool = False
    """The output projection has a bias (Llama's ``attention_bias``)."""
    mlp_bias: bool = False
    """The MLP's projections have biases (Llama's ``mlp_bias``)."""
    qk_norm: bool = False
    """Queries and keys are RMS-normed per head before RoPE (Qwen3, Gemma 3)."""
    norm_offset: float = 0.0
    """RMSNorm multiplies by ``offset + weight`` (Gemma: 1)."""
    embed_scale: float = 1.0
    """Token embeddings are multiplied by this (Gemma: ``sqrt(hidden_size)``)."""
    sandwich_norm: bool = False
    """Four norms per layer: attention and MLP outputs are normed too, before the residual (Gemma 3)."""
    attn_scale: float | None = None
    """Attention logit scale (Gemma 3: ``query_pre_attn_scalar ** -0.5``); default ``head_dim ** -0.5``."""
    layer_types: tuple[str, ...] = ()
    """Each layer's attention, ``FULL`` or ``SLIDING``; empty: every layer full."""
    sliding_window: int | None = None
    """Keys a sliding layer's query sees: positions ``> p - sliding_window`` (transformers' rule)."""
    final_logit_softcapping: float | None = None
    """Logits become ``cap * tanh(logits / cap)`` when set."""
    fused_projections: bool = False
    """The checkpoint stores ``qkv_proj`` and ``gate_up_proj`` fused (Phi-3); split at load."""
    checkpoint_prefix: str = ""
    """Where the decoder's tensors live in a multimodal checkpoint (``gemma3``: its language model)."""
    bos_token_id: int | None = None
    """Beginning-of-sequence id (the tokenizer prepends it; the engine does not)."""
    eos_token_ids: tuple[int, ...] = ()
    """End-of-sequence ids; generation stops at any of them unless told to ignore them."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidConfig(f"{name} must be a positive int, got {value!r}")
        if self.model_type not in FAMILIES:
            raise InvalidConfig(f"model_type {self.model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise InvalidConfig(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise InvalidConfig(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        for name in ("rope_theta", "local_rope_theta"):
            theta = getattr(self, name)
            if theta is not None and not (math.isfinite(theta) and theta > 0):
                raise InvalidConfig(f"{name} must be > 0, got {theta}")
        if self.head_dim % 2:
            raise InvalidConfig(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise InvalidConfig(f"partial_rotary_factor {self.partial_rotary_factor} must give an even number "
                                f"of rotated dimensions in (0, head_dim={self.head_dim}]")
        if self.hidden_act not in ACTIVATIONS:
            raise InvalidConfig(f"hidden_act {self.hidden_act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - {FULL, SLIDING}:
                raise InvalidConfig(f"layer_types must name {FULL!r} or {SLIDING!r} for each of the "
                                    f"{self.num_layers} layers, got {list(self.layer_types)}")
            if SLIDING in self.layer_types and not (self.sliding_window and self.sliding_window >= 1):
                raise InvalidConfig(f"sliding layers need sliding_window >= 1, got {self.sliding_window}")
        for tid in ((self.bos_token_id,) if self.bos_token_id is not None else ()) + self.eos_token_ids:
            if not 0 <= tid < self.vocab_size:
                raise InvalidConfig(f"special token id {tid} outside the vocabulary [0, {self.vocab_size})")

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head RoPE rotates."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def context(self) -> int:
        """Positions fastmode serves: ``max_position_embeddings``, or a longrope model's pre-training
        context (see ``RopeScaling.short_factor``)."""
        s = self.rope_scaling
        if isinstance(s, RopeScaling) and s.kind == "longrope":
            return min(self.max_position_embeddings, s.original_max_position_embeddings)
        return self.max_position_embeddings

    def layer_type(self, i: int) -> str:
        """``FULL`` or ``SLIDING``: the attention of global layer ``i``."""
        return self.layer_types[i] if self.layer_types else FULL

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """Bytes of keys and values one token takes in every layer's cache on one tensor-parallel rank."""
        return self.num_layers * 2 * max(1, self.num_kv_heads // tp) * self.head_dim * dtype_bytes

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``<path>/config.json`` (``path`` may also be the json file itself)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise InvalidConfig(f"no config.json at {path}")
        try:
            raw = json.loads(file.read_text())
        except ValueError as e:
            raise InvalidConfig(f"{file} is not JSON: {e}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the fields of a Hugging Face config (as in ``config.json``) of one of ``FAMILIES``."""
        model_type = raw.get("model_type", "llama")
        prefix = ""
        if model_type == "gemma3":  # the multimodal checkpoint: serve its language model
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise InvalidConfig("a gemma3 config.json needs text_config (its language model)")
            raw, model_type, prefix = {**text, "model_type": "gemma3_text"}, "gemma3_text", "language_model."
            raw.setdefault("eos_token_id", raw.get("eos_token_id"))
        if model_type not in FAMILIES:
            raise InvalidConfig(f"model_type {model_type!r} is not supported; supported: "
                                f"{', '.join(FAMILIES)} (and gemma3's text part)")
        quant = raw.get("quantization_config")
        if quant:
            method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
            raise InvalidConfig(f"quantization_config: {method!r} checkpoints are not supported by fastmode's "
                                "executor; give it the unquantized (bfloat16/float16/float32) checkpoint")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings")
        missing = [k for k in required if raw.get(k) is None]
        if missing:
            raise InvalidConfig(f"config.json lacks {missing}")
        gemma = model_type == "gemma3_text"
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "silu" if gemma else raw.get("hidden_act", "silu")
        if act == "gelu_pytorch_tanh" or (gemma and act in ("gelu", "gelu_tanh")):
            act = "gelu_pytorch_tanh"
        for flag in ("attn_logit_softcapping",):
            if raw.get(flag) is not None:
                raise InvalidConfig(f"{flag}={raw[flag]} is not supported")
        if raw.get("use_bidirectional_attention"):
            raise InvalidConfig("use_bidirectional_attention=true is not supported (decoders only)")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        rope = _rope_parameters(raw, gemma)
        theta, scaling, partial = _rope(rope[FULL], raw)
        local_theta = None
        if gemma:
            local_theta, local_scaling, _ = _rope(rope[SLIDING], raw)
            if local_scaling is not None:
                raise InvalidConfig("sliding layers' RoPE scaling is not supported (only a base of their own)")
        layer_types, window = _layer_types(raw, model_type)
        eos = raw.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            partial_rotary_factor=partial,
            local_rope_theta=local_theta,
            max_position_embeddings=raw["max_position_embeddings"],
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", gemma)),
            hidden_act=act,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            norm_offset=1.0 if gemma else 0.0,
            embed_scale=raw["hidden_size"] ** 0.5 if gemma else 1.0,
            sandwich_norm=gemma,
            attn_scale=float(raw.get("query_pre_attn_scalar", head_dim)) ** -0.5 if gemma else None,
            layer_types=layer_types,
            sliding_window=window,
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            fused_projections=model_type == "phi3",
            checkpoint_prefix=prefix,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _rope_parameters(raw: dict[str, Any], gemma: bool) -> dict[str, dict[str, Any]]:
    """Each attention kind's RoPE settings as one dict (``rope_theta`` inside), from either spelling."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and (FULL in params or SLIDING in params):  # per layer type (Gemma 3)
        full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
    else:
        full = dict(params or raw.get("rope_scaling") or {})
        full.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
        local = {"rope_theta": raw.get("rope_local_base_freq", 10000.0)} if gemma else {}
    for p in (full, local):
        if "partial_rotary_factor" not in p and "partial_rotary_factor" in raw:
            p["partial_rotary_factor"] = raw["partial_rotary_factor"]
    return {FULL: full, SLIDING: local}


def _rope(params: dict[str, Any], raw: dict[str, Any]) -> tuple[float, Llama3RopeScaling | RopeScaling | None, float]:
    """(theta, scaling, partial_rotary_factor) of one RoPE settings dict."""
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    partial = float(params.get("partial_rotary_factor", 1.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "su":  # Phi-3's early name for longrope
        kind = "longrope"
    original = params.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
    if kind == "default":
        return theta, None, partial
    if kind == "llama3":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
        if missing:
            raise InvalidConfig(f"llama3 rope scaling lacks {missing}")
        return theta, Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            # transformers falls back to max_position_embeddings when this is absent.
            original_max_position_embeddings=int(original or raw["max_position_embeddings"]),
        ), partial
    if kind in ("linear", "yarn", "longrope"):
        opt = lambda k: params.get(k)  # noqa: E731
        if kind == "yarn" and original is None:
            original = raw["max_position_embeddings"]  # transformers' fallback
        return theta, RopeScaling(
            kind=kind, factor=None if opt("factor") is None else float(opt("factor")),
            original_max_position_embeddings=None if original is None else int(original),
            attention_factor=opt("attention_factor"), beta_fast=opt("beta_fast"), beta_slow=opt("beta_slow"),
            mscale=opt("mscale"), mscale_all_dim=opt("mscale_all_dim"), truncate=bool(params.get("truncate", True)),
            short_factor=None if opt("short_factor") is None else tuple(map(float, opt("short_factor"))),
            long_factor=None if opt("long_factor") is None else tuple(map(float, opt("long_factor"))),
        ), partial
    if kind == "dynamic":
        raise InvalidConfig("rope_type 'dynamic' (NTK scaling that changes with each sequence's length) is not "
                            "supported; supported: default, llama3, linear, yarn, longrope")
    raise InvalidConfig(f"rope_type {kind!r} is not supported; supported: default, llama3, linear, yarn, longrope")


def _layer_types(raw: dict[str, Any], model_type: str) -> tuple[tuple[str, ...], int | None]:
    """Each layer's attention kind and the sliding window, as transformers derives them per family."""
    n, window = raw["num_hidden_layers"], raw.get("sliding_window")
    types = raw.get("layer_types")
    if model_type in ("qwen2", "qwen3"):
        if not raw.get("use_sliding_window", False):
            window = None
        if types is None:
            start = raw.get("max_window_layers", n)
            types = [SLIDING if window is not None and i >= start else FULL for i in range(n)]
    elif model_type == "gemma3_text":
        if types is None:
            pattern = raw.get("sliding_window_pattern", 6)
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    elif model_type in ("mistral", "phi3"):
        types = [SLIDING if window else FULL] * n  # one window for every layer when set
    elif types is None or window is None:  # llama
        types = [FULL] * n
    types = tuple(types)
    if SLIDING not in types:
        return (), None
    return types, window
