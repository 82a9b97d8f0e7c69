"""Build a fresh Hugging Face Llama from a shape, and write one as a shipped checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .config import ModelShape

CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
)


def new_model(shape: ModelShape, *, vocab_size: int, max_positions: int, special: dict[str, int]) -> LlamaForCausalLM:
    """A randomly initialised fp32 ``LlamaForCausalLM`` (seed the global RNG first)."""
    fields = shape.hf_config(
        vocab_size=vocab_size, max_positions=max_positions,
        bos_id=special["bos"], eos_id=special["eos"], pad_id=special["pad"],
    )
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "model_type", "torch_dtype")}
    return LlamaForCausalLM(LlamaConfig(**fields)).float()


def write_checkpoint(model: LlamaForCausalLM, tokenizer_dir: Path, out_dir: Path) -> None:
    """Save weights as bf16 safetensors plus the tokenizer files, as a standard HF checkpoint."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = "bfloat16"
    model.generation_config.bos_token_id = model.config.bos_token_id
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
    missing = [f for f in CHECKPOINT_FILES if not (out_dir / f).exists()]
    if missing:
        raise RuntimeError(f"checkpoint {out_dir} is missing {missing}")
    # save_pretrained may write extra fields; keep config.json readable and stable.
    cfg = json.loads((out_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_fp32(path: Path) -> LlamaForCausalLM:
    """Load a shipped checkpoint upcast to fp32 (the reference for every correctness test)."""
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (a tied head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
