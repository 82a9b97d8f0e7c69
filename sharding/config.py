"""``ModelConfig``: the shape of a Llama decoder, read from a Hugging Face ``config.json``.

Both spellings of RoPE settings are accepted: the transformers 4 one (top-level ``rope_theta``
plus ``rope_scaling``) and the transformers 5 one (``rope_parameters``, which carries
``rope_theta`` inside it and is what ``save_pretrained`` writes today).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InvalidConfig


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
class ModelConfig:
    """A Llama decoder's hyper-parameters; every field mirrors one ``config.json`` field."""

    vocab_size: int
    """Rows of the embedding and of the output head."""
    hidden_size: int
    """Residual stream width ``D``."""
    intermediate_size: int
    """SwiGLU hidden width."""
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
    """RoPE base wavelength."""
    rope_scaling: Llama3RopeScaling | None = None
    """Llama-3.x frequency scaling, or ``None`` for plain RoPE."""
    max_position_embeddings: int
    """Context window: positions ``0 .. max_position_embeddings - 1``."""
    tie_word_embeddings: bool
    """The output head shares the input embedding's weight."""
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
        if self.num_heads % self.num_kv_heads:
            raise InvalidConfig(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise InvalidConfig(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
            raise InvalidConfig(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.head_dim % 2:
            raise InvalidConfig(f"head_dim must be even for RoPE, got {self.head_dim}")
        for tid in ((self.bos_token_id,) if self.bos_token_id is not None else ()) + self.eos_token_ids:
            if not 0 <= tid < self.vocab_size:
                raise InvalidConfig(f"special token id {tid} outside the vocabulary [0, {self.vocab_size})")

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``<path>/config.json`` (``path`` may also be the json file itself)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise InvalidConfig(f"no config.json at {path}")
        return cls.from_dict(json.loads(file.read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from the fields of a Hugging Face ``LlamaConfig`` (as in ``config.json``)."""
        model_type = raw.get("model_type", "llama")
        if model_type != "llama":
            raise InvalidConfig(f"only model_type 'llama' is supported, got {model_type!r}")
        if raw.get("hidden_act", "silu") != "silu":
            raise InvalidConfig(f"only hidden_act 'silu' is supported, got {raw['hidden_act']!r}")
        for flag in ("attention_bias", "mlp_bias"):
            if raw.get(flag, False):
                raise InvalidConfig(f"{flag}=true is not supported")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "max_position_embeddings")
        missing = [k for k in required if raw.get(k) is None]
        if missing:
            raise InvalidConfig(f"config.json lacks {missing}")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        theta, scaling = _rope(raw)
        eos = raw.get("eos_token_id")
        eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(
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
            max_position_embeddings=raw["max_position_embeddings"],
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _rope(raw: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """(theta, scaling) from ``rope_parameters`` (transformers 5) or ``rope_theta``/``rope_scaling`` (4)."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise InvalidConfig(f"rope_type {kind!r} is not supported (only 'default' and 'llama3')")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
        raise InvalidConfig(f"llama3 rope scaling lacks {missing}")
    return float(theta), Llama3RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        # transformers falls back to max_position_embeddings when this is absent.
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", raw["max_position_embeddings"])),
    )
