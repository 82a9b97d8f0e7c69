"""The student as a module: the full model with only the kept layers, started from their weights.

The embedding and the output head stay the full model's (frozen: the student is shipped without
them, ``export``); the kept layers and the final norm are trained.
"""

from __future__ import annotations

import re

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from .shape import student_config

_LAYER = re.compile(r"^(.*\.layers\.)(\d+)(\..*)$")


def shared_names(model) -> list[str]:
    """The student's tensors that stay the full model's: the embedding (and an untied head)."""
    names = [n for n, _ in model.named_parameters() if "embed_tokens" in n]
    if not model.config.tie_word_embeddings:
        names += [n for n, _ in model.named_parameters() if n.startswith("lm_head")]
    return names


def build(full, keep: tuple[int, ...]):
    """A float32 student made from the full ``full`` model (a transformers causal LM) and ``keep``."""
    config = AutoConfig.for_model(**student_config(full.config.to_dict(), keep))
    student = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = full.state_dict()
    index = {old: new for new, old in enumerate(keep)}
    state = {}
    for name, tensor in source.items():
        m = _LAYER.match(name)
        if m is None:
            state[name] = tensor
        elif int(m.group(2)) in index:
            state[f"{m.group(1)}{index[int(m.group(2))]}{m.group(3)}"] = tensor
    missing, unexpected = student.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"student from the full model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if config.tie_word_embeddings:
        student.tie_weights()
    for name, p in student.named_parameters():
        p.requires_grad_(name not in shared_names(student))
    return student


def answer_logits(student, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [N, V] at the flat ``positions`` of ``ids`` [B, S] (the head applied only there)."""
    hidden = student.model(input_ids=ids).last_hidden_state  # [B, S, D]
    picked = hidden.reshape(-1, hidden.size(-1))[positions]  # [N, D]
    return torch.log_softmax(student.lm_head(picked).float(), dim=-1)
