"""``PromptIds``: a lane's tokenizer that keeps the ids of recent prompts, so that a prompt which
continues one of them (the next turn of a conversation) tokenizes only what is new.

Why: a conversation's turn ``n + 1`` is turn ``n``'s prompt, its output and the new input, joined
at line breaks (``serve.request.join_messages``; the router joins the history kept for
``previous_response_id`` the same way). Tokenizing the whole history again costs time in
proportion to its tokens: the longer the conversation, the later its first token, although the
lane's prefix cache already holds the history's keys and values.

Exact, not approximate: the shipped tokenizers split the text at every ``"\\n"`` before anything
else (pre-tokenizer ``Split("\\n", "isolated")`` first, no normalizer), and BPE never merges across
a pre-token's edge. So for a kept prompt ``A`` and any ``B``, the ids of ``A + "\\n" + B`` are the
kept ids of ``A`` followed by the ids of ``"\\n" + B`` without special tokens: exactly what
tokenizing the whole text gives (tests/serve/test_prompt_ids.py checks it against the tokenizer
itself). A tokenizer without that split (``incremental`` false) tokenizes every prompt whole.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict

from tokenizers import Tokenizer

from .word_ids import WordIds

KEPT_TOKENS = 262_144
"""Prompt ids kept at most (all prompts together; least recently used first out): about 10 MB, the
histories of a few hundred conversations of ~1,000 tokens."""


def splits_at_newlines(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` tokenizes text split at a ``"\\n"`` as its two parts' ids joined: no
    normalizer, and its pre-tokenizer first isolates every ``"\\n"``; its post-processor only puts
    special tokens before and after the text (checked by ``PromptIds``)."""
    spec = json.loads(tokenizer.to_str())
    pre = spec.get("pre_tokenizer") or {}
    first = (pre.get("pretokenizers") or [{}])[0] if pre.get("type") == "Sequence" else pre
    return (spec.get("normalizer") is None and first.get("type") == "Split"
            and first.get("pattern") == {"String": "\n"} and first.get("behavior") == "Isolated")


class PromptIds:
    """``encode(text)``: the ids ``tokenizer.encode(text)`` gives, reusing a kept prompt's.

    Args:
        tokenizer: the lane's tokenizer.
        kept_tokens: the ids kept at most, over all kept prompts (0: keep none).
    """

    def __init__(self, tokenizer: Tokenizer, kept_tokens: int = KEPT_TOKENS) -> None:
        self.tokenizer, self.kept_tokens = tokenizer, kept_tokens
        self.words = WordIds(tokenizer)
        """What tokenizes the new text: the tokenizer's own ids, from kept words (``serve.lanes.word_ids``)."""
        self.incremental = kept_tokens > 0 and splits_at_newlines(tokenizer) and self._joins()
        """Whether prompts reuse kept ids (see the module docstring)."""
        self._kept: OrderedDict[str, list[int]] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        """How many kept prompts have each length (in characters): the cut points worth a lookup."""
        self._tokens = 0
        self.reused_tokens = 0
        """Prompt ids taken from kept prompts instead of tokenized (since start)."""

    def _joins(self) -> bool:
        """The post-processor adds nothing between the parts: whole == kept + continuation."""
        a, b = "def f(x):", "    return x\n"
        return self.tokenizer.encode(a + "\n" + b).ids == (self.tokenizer.encode(a).ids
                                                           + self._continuation("\n" + b))

    def _continuation(self, text: str) -> list[int]:
        return self.words.encode(text, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        """The ids of ``text`` (a new list: the caller may keep or change it)."""
        return self.encode_turn(text)[0]

    def encode_turn(self, text: str) -> tuple[list[int], bool]:
        """The ids of ``text`` (a new list), and whether ``text`` continues a kept prompt: a
        conversation's next turn, sent with ``previous_response_id`` or re-sent whole."""
        if not self.incremental:
            return self.words.encode(text), False
        ids = None
        cut = len(text)
        while (cut := text.rfind("\n", 0, cut)) > 0:  # the longest kept prompt that ``text`` continues
            if self._lengths[cut] and (kept := self._kept.get(text[:cut])) is not None:
                self._kept.move_to_end(text[:cut])
                self.reused_tokens += len(kept)
                ids = kept + self._continuation(text[cut:])
                break
        continues = ids is not None
        if ids is None:
            ids = self.words.encode(text)
        self._keep(text, ids)
        return list(ids), continues

    def _keep(self, text: str, ids: list[int]) -> None:
        if len(ids) > self.kept_tokens:
            return
        old = self._kept.pop(text, None)
        if old is not None:
            self._forget(text, old)
        self._kept[text] = ids
        self._lengths[len(text)] += 1
        self._tokens += len(ids)
        while self._tokens > self.kept_tokens:
            self._forget(*self._kept.popitem(last=False))

    def _forget(self, text: str, ids: list[int]) -> None:
        self._tokens -= len(ids)
        self._lengths[len(text)] -= 1
        if not self._lengths[len(text)]:
            del self._lengths[len(text)]
