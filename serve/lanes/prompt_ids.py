"""``PromptIds``: the one place a request's input becomes a model's prompt ids, for every lane, the
fast lane's door and the ``auto`` router's scorer (``encode_prompt``), keeping the ids of recent
prompts so that a prompt which continues one of them (the next turn of a conversation) tokenizes
only what is new.

What the ids are: a text input (``/v1/completions``, a ``response.create`` with a string
``input``) is tokenized as it is. Chat messages (``serve.request.ChatPrompt``) are rendered by the
model's chat template, the ids exactly transformers' ``apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)``, special-token strings in the contents kept as text
(``serve.chat.ChatTemplate``); a model without a template (the test pair) joins them
(``serve.request.join_messages``) and tokenizes the text, special-token strings typed in the
messages as plain text too (``<|eos|>`` in a message is not the end of a sequence), as transformers'
``tokenizer(text, split_special_tokens=True)``; such a conversation is tokenized whole.

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

A templated prompt is rendered and tokenized whole every time (its special tokens and a template's
rules, ``| trim`` and the like, make the text of turn ``n`` no safe cut point). Whether it continues a
kept one (``continues``, for vLLM's sessions) is decided by ids: the kept prompt is where the
template's generation prompt recurs in the new text, and its ids must be the new ids' first ones.
A template whose turn ``n`` is not a prefix of turn ``n + 1`` (one that re-renders the history
otherwise) continues nothing: every lane gets the whole prompt's ids, and its prefix cache reuses
whatever leading ids match.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter, OrderedDict

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..chat import ChatTemplate
from ..errors import InvalidRequest
from ..request import ChatPrompt
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
    """``encode_prompt(prompt)``: a request's prompt ids; ``encode(text)``: the ids
    ``tokenizer.encode(text)`` gives, reusing a kept prompt's.

    Args:
        tokenizer: the model's tokenizer.
        kept_tokens: the ids kept at most, over all kept prompts (0: keep none).
        chat: the model's chat template (``None``: it has none, messages are joined).
    """

    def __init__(self, tokenizer: Tokenizer, kept_tokens: int = KEPT_TOKENS, chat: ChatTemplate | None = None) -> None:
        self.tokenizer, self.kept_tokens, self.chat = tokenizer, kept_tokens, chat
        self._generation_prompts: dict[str, str | None] = {}
        """The template's generation prompt per ``chat_template_kwargs`` (as JSON)."""
        self._chats: OrderedDict[str, list[int]] = OrderedDict()
        """Kept templated prompts: rendered text -> ids (bounded with the text prompts by ``kept_tokens``)."""
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
        specials = sorted({t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special},
                          key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, specials))) if specials else None
        """Matches the tokenizer's special-token strings (``<|bos|>``, ...) in a text."""
        self._plain = threading.Lock()
        """Held while ``encode_special_tokens`` is set on the tokenizer (``_as_text``)."""

    @classmethod
    def for_model(cls, path: str | Path, tokenizer: Tokenizer | None = None, *, chat_template: str | None = None,
                  chat_template_kwargs: dict[str, Any] | None = None, kept_tokens: int = KEPT_TOKENS) -> PromptIds:
        """The prompt ids of the checkpoint at ``path``: its ``tokenizer.json`` (or ``tokenizer``, the
        same file loaded already), and its chat template if it has one or ``chat_template`` is given
        (the config's, ``models.<model>.chat_template``, with ``chat_template_kwargs``)."""
        if tokenizer is None:
            tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        chat = ChatTemplate.of(path, chat_template, chat_template_kwargs)
        prompt_ids = cls(tokenizer, kept_tokens, chat)
        if chat is not None:
            prompt_ids._generation_prompt(None)  # renders once: the template is compiled before any request
        return prompt_ids

    def encode_prompt(self, prompt: str | ChatPrompt) -> tuple[list[int], bool]:
        """A request's prompt ids (a new list), and whether they continue a kept prompt: a text as it
        is; chat messages through the chat template, or joined without one (see the module docstring)."""
        if isinstance(prompt, str):
            return self.encode_turn(prompt)
        if self.chat is None:
            if prompt.template_kwargs:
                raise InvalidRequest("chat_template_kwargs: the model has no chat template (its messages are "
                                     "joined one per line)")
            text = prompt.joined()
            if self._special is not None and self._special.search(text):
                return self._as_text(text), False  # a message holds a special-token string: plain text
            return self.encode_turn(text)
        return self._encode_chat(prompt)

    def _as_text(self, text: str) -> list[int]:
        """The ids of ``text`` with its special-token strings tokenized as plain text (the tokenizer's
        own added tokens around it kept), as transformers' ``tokenizer(text, split_special_tokens=True)``."""
        with self._plain:
            self.tokenizer.encode_special_tokens = True
            try:
                return self.tokenizer.encode(text).ids
            finally:
                self.tokenizer.encode_special_tokens = False

    def _generation_prompt(self, kwargs: dict[str, Any] | None) -> str | None:
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in self._generation_prompts:
            if len(self._generation_prompts) >= 64:  # kwargs are the client's: bound what they keep
                self._generation_prompts.clear()
            self._generation_prompts[key] = self.chat.generation_prompt(kwargs)
        return self._generation_prompts[key]

    def _encode_chat(self, prompt: ChatPrompt) -> tuple[list[int], bool]:
        text, ids = self.chat.encode([{"role": r, "content": c} for r, c in prompt.messages],
                                     kwargs=prompt.template_kwargs)
        continues = False
        if self.kept_tokens > 0:
            marker = self._generation_prompt(prompt.template_kwargs)
            end = len(text) - len(marker or "")
            while marker and (at := text.rfind(marker, 0, end)) >= 0:  # the longest kept prompt first
                end = at
                kept = self._chats.get(text[:at + len(marker)])
                if kept is not None and ids[:len(kept)] == kept:
                    self._chats.move_to_end(text[:at + len(marker)])
                    continues = True
                    break
            self._keep(self._chats, text, ids)
        return list(ids), continues

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
        self._keep(self._kept, text, ids)
        return list(ids), continues

    def _keep(self, store: OrderedDict[str, list[int]], text: str, ids: list[int]) -> None:
        """Keep ``ids`` as the prompt ``text``'s in ``store`` (``_kept``: text prompts; ``_chats``:
        templated ones), most recently used; then, while the ids kept in both are over ``kept_tokens``,
        drop ``store``'s least recently used prompts, never the one just kept, then the other store's: a
        prompt pushes out prompts of its own kind first, and a kind with nothing else kept (text prompts
        on a server full of chats) still keeps its prompt."""
        if len(ids) > self.kept_tokens:
            return
        if (old := store.pop(text, None)) is not None:
            self._forget(store, text, old)
        store[text] = ids
        self._tokens += len(ids)
        if store is self._kept:
            self._lengths[len(text)] += 1
        while self._tokens > self.kept_tokens and len(store) > 1:  # the last one is the prompt just kept
            self._forget(store, *store.popitem(last=False))
        other = self._chats if store is self._kept else self._kept
        while self._tokens > self.kept_tokens and other:
            self._forget(other, *other.popitem(last=False))

    def _forget(self, store: OrderedDict[str, list[int]], text: str, ids: list[int]) -> None:
        """Account for ``text``'s ``ids``, taken out of ``store``."""
        self._tokens -= len(ids)
        if store is self._kept:
            self._lengths[len(text)] -= 1
            if not self._lengths[len(text)]:
                del self._lengths[len(text)]
