"""What the eval needs from an engine, and the reference implementation on transformers.

Any engine (transformers, vLLM, our sharded executor, a serving lane over the network) can be
evaluated by implementing ``Backend``: greedy continuations of text prompts, and the total
log-likelihood of texts. The metrics are computed from these alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from sharding.draft_vocab import other_ids


@dataclass(frozen=True)
class Request:
    """One greedy generation the v2 eval asks for: ``prompt`` is plain text (continued as is) or chat
    messages (``{"role", "content"}`` dicts, rendered by the model's chat template); the output
    stops after ``max_tokens`` tokens, at the end of the model's turn, or at the first of ``stop``
    (the stop string itself not included)."""

    prompt: str | tuple[dict[str, str], ...]
    max_tokens: int
    stop: tuple[str, ...] = ()


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to the first of ``stop`` (every engine's output is cut the same way)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]


def join_messages(messages) -> str:
    """The text chat messages make for a model without a chat template: their contents one per
    line, as the lanes join them (``serve.request.join_messages``, for messages that do not start
    with a line break)."""
    return "\n".join(m["content"] for m in messages)


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


class Generator(Protocol):
    """An engine under the v2 eval (``models.eval.suite``): greedy outputs of ``Request``s."""

    name: str

    def generate(self, requests: list[Request]) -> list[str]:
        """Each request's greedy output text, cut at its stop strings (``cut_at_stop``)."""
        ...


class _KeepRows:
    """A transformers logits processor: row ``b`` may produce only ``keep`` and ``prompts[b]``'s ids."""

    def __init__(self, keep: torch.Tensor, prompts: list[list[int]]):
        self.keep, self.prompts, self.allowed = keep, prompts, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.allowed is None or self.allowed.shape != scores.shape:
            self.allowed = torch.zeros(scores.shape, dtype=torch.bool)
            self.allowed[:, self.keep] = True
            for b, ids in enumerate(self.prompts):
                self.allowed[b, torch.tensor(ids, dtype=torch.long)] = True
        return scores.masked_fill(~self.allowed.to(scores.device), float("-inf"))


class TransformersBackend:
    """Hugging Face transformers in fp32: the reference nobody here wrote."""

    def __init__(self, path: str | Path, batch_size: int = 16, name: str | None = None,
                 keep: list[int] | None = None, keep_prompt: bool = False):
        """``keep``: the only token ids ``generate`` may produce (a cut vocabulary, as the fast lane's
        ``vocab``): transformers' ``suppress_tokens`` takes every other one; ``keep_prompt``: each
        request may also produce its own prompt's tokens (the lane's ``vocab_keeps_prompt``), a
        logits processor masking each row apart."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = name or Path(path).name
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.batch_size = batch_size
        self.suppress = None if keep is None else other_ids(keep, self.model.config.vocab_size)
        self.keep = torch.tensor(sorted(set(keep)), dtype=torch.long) if keep is not None and keep_prompt else None
        """With ``keep_prompt``: the kept ids, which ``_KeepRows`` widens per row by its prompt's."""
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

    def render(self, prompt: str | tuple[dict[str, str], ...]) -> list[int]:
        """A request's prompt ids: plain text tokenized as usual (``<|bos|>`` first where the
        tokenizer adds it); messages through the chat template with the generation prompt (or joined,
        ``join_messages``, for a model without one)."""
        tok = self.tokenizer
        if isinstance(prompt, str):
            return tok(prompt).input_ids
        if tok.chat_template:
            text = tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return tok(text, add_special_tokens=False).input_ids
        return tok(join_messages(prompt)).input_ids

    @torch.no_grad()
    def generate(self, requests: list[Request]) -> list[str]:
        """Greedy outputs, batched (``batch_size``) among requests of the same ``max_tokens`` and
        ``stop``, longest prompts first; each stops at the model's end of turn or a stop string."""
        tok = self.tokenizer
        ids = [self.render(r.prompt) for r in requests]
        out: list[str | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_tokens, r.stop), []).append(i)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos = self.model.generation_config.eos_token_id
        eos = [e for e in ([eos] if isinstance(eos, int) else (eos or [])) if e is not None] or [tok.eos_token_id]
        for (max_tokens, stop), members in groups.items():
            members.sort(key=lambda i: -len(ids[i]))
            for k in range(0, len(members), self.batch_size):
                batch = members[k : k + self.batch_size]
                width = max(len(ids[i]) for i in batch)
                input_ids = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in batch])
                mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in batch])
                kwargs = {"stop_strings": list(stop), "tokenizer": tok} if stop else {}
                if self.keep is not None:
                    from transformers import LogitsProcessorList

                    kwargs["logits_processor"] = LogitsProcessorList([_KeepRows(self.keep, [ids[i] for i in batch])])
                elif self.suppress is not None:
                    kwargs["suppress_tokens"] = self.suppress
                gen = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens,
                                          do_sample=False, eos_token_id=eos, pad_token_id=pad, **kwargs)
                for i, row in zip(batch, gen[:, width:]):
                    out[i] = cut_at_stop(tok.decode(row, skip_special_tokens=True), stop)
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
