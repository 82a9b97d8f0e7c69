"""The ``auto`` router's difficulty signal: how surprised the fast model is by the prompt.

``score(prompt)`` is the fast model's mean next-token loss (nats per token) over the prompt's
last ``max_tokens`` tokens: the ids the fast lane would get (``PromptIds.encode_prompt``, the fast
model's chat template included). A low score means the prompt is the kind of text the small model
predicts well (boilerplate, repetition, common idioms), where its continuation is likely as good
as the full model's; a high score means unfamiliar or dense text, which goes to the full model.
It costs one prefill of the small model in the router's own process, and needs no extra model.
``python -m bench.difficulty`` calibrates it: the score's distribution on held-out prompts and, per
quartile, how often each model's next line is exactly right.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from sharding.engine import Engine

from .lanes.prompt_ids import PromptIds
from .request import ChatPrompt


class DifficultyScorer:
    """Scores prompts with the fast model, in this process (thread-safe; one prompt at a time)."""

    def __init__(self, path: str | Path, max_tokens: int = 128, *, chat_template: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        # a conversation's next turn: only its new text
        self.prompt_ids = PromptIds.for_model(path, self.tokenizer, chat_template=chat_template,
                                              chat_template_kwargs=chat_template_kwargs)
        self.max_tokens = max_tokens
        # One small prefill per request: more intra-op threads would only contend with the
        # engines' processes for the same cores.
        torch.set_num_threads(1)
        self.engine = Engine.from_pretrained(path, num_slots=1, max_len=max_tokens + 1)
        self._lock = threading.Lock()

    def score(self, prompt: str | ChatPrompt) -> float:
        """Mean loss in nats per token of the prompt's last ``max_tokens`` tokens (0 if too short)."""
        with self._lock:
            ids = self.prompt_ids.encode_prompt(prompt)[0]
        if len(ids) > self.max_tokens:  # keep <|bos|>, then the tail
            ids = ids[:1] + ids[len(ids) - self.max_tokens + 1:]
        if len(ids) < 2:
            return 0.0
        with self._lock, torch.inference_mode():
            logits = self.engine.prompt_logits(ids)  # [S, V]
        return F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:])).item()
