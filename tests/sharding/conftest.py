"""Checkpoints for the executor's tests, and their Hugging Face references.

``checkpoint`` runs each test on: the tiny recipe's pair (``tiny-full``, untied, GQA; ``tiny-fast``,
tied), a random tied GQA model (``random-tied``: the tiny fast model has one kv head, so cannot
be split two ways), and the shipped pair when present (skipped otherwise).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from models import TEST_FAST, TEST_FULL
from sharding.sampling import SamplingParams
from tests.conftest import shipped

TINY = ("tiny-full", "tiny-fast", "random-tied")
SHIPPED = ("full", "fast")
GQA = ("tiny-full", "random-tied", "full", "fast")
"""Checkpoints whose kv heads split two ways (tensor parallel tests)."""


def save_random_llama(out: Path, **overrides) -> Path:
    """Save a randomly initialised fp32 ``LlamaForCausalLM`` (seeded) as an HF checkpoint at ``out``."""
    fields = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                  bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True,
                  # Larger than the usual 0.02 so logits are peaked and greedy choices are not near-ties.
                  initializer_range=0.2)
    fields.update(overrides)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**fields)).float().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_dir(tiny_models) -> Path:
    """``full``/``fast`` from the real tiny recipe (shared with tests/models) plus ``random-tied``."""
    save_random_llama(tiny_models / "random-tied")
    return tiny_models


def resolve(name: str, tiny: Path) -> Path:
    """The directory of checkpoint ``name`` (skips the test for a shipped one not yet written)."""
    if name in SHIPPED:
        return shipped({"full": TEST_FULL, "fast": TEST_FAST}[name])
    return tiny / name.removeprefix("tiny-")


@pytest.fixture(params=TINY + SHIPPED)
def checkpoint(request, tiny_dir) -> Path:
    """Each checkpoint in turn."""
    return resolve(request.param, tiny_dir)


@functools.cache
def hf_model(path: Path) -> LlamaForCausalLM:
    """The transformers reference for ``path``, fp32, loaded once per session."""
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def prompt_ids(path: Path, length: int, seed: int = 0) -> list[int]:
    """A fixed prompt of ``length`` tokens: bos, then seeded random ids above the special tokens."""
    vocab = hf_model(path).config.vocab_size
    g = torch.Generator().manual_seed(seed)
    return [0] + torch.randint(3, vocab, (length - 1,), generator=g).tolist()


@torch.no_grad()
def hf_logits(path: Path, ids: list[int]) -> torch.Tensor:
    """transformers' logits ``[S, V]`` for one prompt."""
    return hf_model(path)(torch.tensor([ids])).logits[0]


@torch.no_grad()
def hf_greedy(path: Path, ids: list[int], n: int, **processing) -> list[int]:
    """transformers' ``generate(do_sample=False)``: up to ``n`` new tokens, stopping after eos
    (``processing``: more of ``generate``'s arguments, e.g. ``hf_processing``'s)."""
    model = hf_model(path)
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                         pad_token_id=model.config.pad_token_id, **processing)
    return out[0, len(ids):].tolist()


def hf_processing(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> dict:
    """``generate``'s arguments for the logits processing of greedy ``params``: transformers'
    ``repetition_penalty``, ``sequence_bias`` (one-token sequences: ``logit_bias``) and
    ``min_new_tokens``; ``stop_token_ids`` join the eos ids (transformers stops on those)."""
    kw = {}
    if params.repetition_penalty != 1:
        kw["repetition_penalty"] = params.repetition_penalty
    if params.logit_bias:
        kw["sequence_bias"] = [[[t], float(b)] for t, b in params.logit_bias]
    if params.min_tokens:
        kw["min_new_tokens"] = params.min_tokens
    if params.stop_token_ids:
        kw["eos_token_id"] = [*eos_token_ids, *params.stop_token_ids]
    return kw
