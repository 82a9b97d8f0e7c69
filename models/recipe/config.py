"""Configs of the recipe: model shapes and training schedules, one dataclass each.

``RECIPES`` holds the named recipes: ``shipped`` made the checkpoints in ``models/``; ``tiny``
runs in seconds and is what the tests use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A Llama decoder's shape; becomes a Hugging Face ``LlamaConfig``."""

    hidden_size: int
    """Residual stream width."""
    num_layers: int
    """Decoder blocks."""
    num_heads: int
    """Query heads; ``hidden_size`` must divide by it."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    intermediate_size: int
    """SwiGLU hidden width."""
    tie_embeddings: bool
    """Share the input embedding with the output head."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not divisible by num_kv_heads {self.num_kv_heads}")

    def hf_config(self, *, vocab_size: int, max_positions: int, bos_id: int, eos_id: int, pad_id: int) -> dict:
        """The ``config.json`` fields of a standard ``LlamaForCausalLM``."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.hidden_size // self.num_heads,
            "hidden_act": "silu",
            "max_position_embeddings": max_positions,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "initializer_range": 0.02,
            "torch_dtype": "bfloat16",
            "use_cache": True,
        }


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """An AdamW schedule with linear warm-up and cosine decay to 10% of the peak."""

    steps: int
    """Optimizer steps."""
    batch_size: int
    """Sequences per step."""
    seq_len: int
    """Tokens per sequence (the model's context is ``Recipe.max_positions``)."""
    lr: float
    """Peak learning rate."""
    warmup: int
    """Warm-up steps."""
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Everything that determines the shipped pair, given the corpus."""

    name: str
    vocab_size: int
    """BPE vocabulary including the three special tokens."""
    max_positions: int
    """Context length written into both configs."""
    full: ModelShape
    fast: ModelShape
    pretrain: Schedule
    """Next-token training of full."""
    distill: Schedule
    """Logit distillation of fast from full."""
    kd_temperature: float = 1.0
    """Softmax temperature of the distillation KL."""
    kd_weight: float = 0.9
    """Loss = kd_weight * KL(full || fast) * T^2 + (1 - kd_weight) * cross-entropy."""
    seed: int = 1234
    tokenizer_sample_bytes: int = 4_000_000
    """Train the tokenizer on this many bytes of training files (in corpus order)."""
    max_train_files: int | None = None
    """Use only the first N training files (tests)."""
    eval_every: int = 500
    """Held-out loss every N steps."""
    checkpoint_every: int = 200
    """Write the resumable checkpoint every N steps."""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


RECIPES: dict[str, Recipe] = {
    "shipped": Recipe(
        name="shipped",
        vocab_size=4096,
        max_positions=512,
        full=ModelShape(hidden_size=256, num_layers=8, num_heads=8, num_kv_heads=4,
                        intermediate_size=704, tie_embeddings=False),
        fast=ModelShape(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                        intermediate_size=352, tie_embeddings=True),
        pretrain=Schedule(steps=1800, batch_size=8, seq_len=512, lr=2e-3, warmup=100),
        distill=Schedule(steps=1200, batch_size=8, seq_len=512, lr=3e-3, warmup=50),
        eval_every=300,
    ),
    "tiny": Recipe(
        name="tiny",
        vocab_size=600,
        max_positions=128,
        # head_dim 32: the smallest head vLLM's CPU attention supports.
        full=ModelShape(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=192, tie_embeddings=False),
        fast=ModelShape(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                        intermediate_size=64, tie_embeddings=True),
        pretrain=Schedule(steps=6, batch_size=2, seq_len=32, lr=1e-3, warmup=2),
        distill=Schedule(steps=4, batch_size=2, seq_len=32, lr=1e-3, warmup=1),
        tokenizer_sample_bytes=200_000,
        max_train_files=12,
        eval_every=3,
        checkpoint_every=2,
    ),
}
