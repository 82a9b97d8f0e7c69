"""What the eval needs from an engine, and the reference implementation on transformers.

Any engine (transformers, vLLM, our sharded executor, a serving lane over the network) can be
evaluated by implementing ``Backend``: greedy continuations of text prompts, and the total
log-likelihood of texts. The metrics are computed from these alone.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import torch


class Backend(Protocol):
    """An engine under evaluation."""

    name: str

    def complete(self, prompts: list[str], max_tokens: int) -> list[str]:
        """Greedy continuation text of each prompt. May stop early once a newline was produced;
        the eval only looks at the text up to the first newline."""
        ...

    def nll(self, texts: list[str]) -> list[float]:
        """Total negative log-likelihood (nats) of each text's tokens, given ``<|bos|>`` only."""
        ...


class TransformersBackend:
    """Hugging Face transformers in fp32: the reference nobody here wrote."""

    def __init__(self, path: str | Path, batch_size: int = 16, name: str | None = None):
        from transformers import AutoTokenizer, LlamaForCausalLM

        self.name = name or Path(path).name
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.batch_size = batch_size
        self.newline_ids = torch.tensor(
            [i for tok, i in self.tokenizer.get_vocab().items()
             if "\n" in self.tokenizer.convert_tokens_to_string([tok])]
        )

    @torch.no_grad()
    def complete(self, prompts: list[str], max_tokens: int) -> list[str]:
        out = []
        tok = self.tokenizer
        tok.padding_side = "left"
        tok.truncation_side = "left"  # an over-long prompt keeps its end, next to the line asked for
        budget = self.model.config.max_position_embeddings - max_tokens
        for i in range(0, len(prompts), self.batch_size):
            batch = tok(prompts[i : i + self.batch_size], return_tensors="pt", padding=True,
                        truncation=True, max_length=budget)
            gen = self.model.generate(
                **batch, max_new_tokens=max_tokens, do_sample=False,
                eos_token_id=[tok.eos_token_id, *self.newline_ids.tolist()], pad_token_id=tok.pad_token_id,
            )
            new = gen[:, batch.input_ids.shape[1]:]
            out += tok.batch_decode(new, skip_special_tokens=True)
        return out

    @torch.no_grad()
    def nll(self, texts: list[str]) -> list[float]:
        out = []
        for text in texts:
            ids = self.tokenizer(text, return_tensors="pt").input_ids  # [1, 1 + n]: bos first
            if ids.shape[1] > self.model.config.max_position_embeddings:
                raise ValueError(f"text of {ids.shape[1]} tokens exceeds the model's context")
            logits = self.model(input_ids=ids).logits[0, :-1].float()  # [n, V]
            logp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])
            out.append(-float(logp.sum()))
        return out


def bits_per_byte(nll_nats: list[float], texts: list[str]) -> float:
    """Total nats over total UTF-8 bytes, in bits."""
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return sum(nll_nats) / math.log(2) / total_bytes
