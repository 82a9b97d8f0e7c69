"""``ChatTemplate``: chat messages as a model's prompt ids, through the model's own chat template.

Every lane (and the fast lane's door, and ``auto``'s scorer) turns a conversation into ids here,
through ``serve.lanes.prompt_ids.PromptIds.encode_prompt``, whichever front door it came from: the template
(``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``, or the config's
override) is rendered by transformers' ``apply_chat_template`` with the generation prompt added,
and the text is tokenized without adding special tokens, as ``apply_chat_template(...,
tokenize=True)`` does. So a lane receives exactly the ids transformers would give the model.

User text cannot forge control tokens. A message's content is rendered with each special-token
string in it (``<|im_start|>``, ``<|eot_id|>``, ...) stood in for by a private-use character; the
rendered text is then tokenized piecewise: the template's own text with its special tokens, each
stood-in string as plain text (the tokenizer's ``encode_special_tokens``). A conversation without
such strings in its contents (every ordinary one) tokenizes as the whole text does.

A model without a chat template has none to apply: ``ChatTemplate.of`` returns ``None`` and the
lanes join the messages as before (``serve.request.join_messages``).

``end_of_turn_ids``: the ids a checkpoint's turn ends on, which every lane stops on.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidRequest

_PRIVATE = 0xF0000
"""First code point of the stand-ins (Supplementary Private Use Area-A: no template or tokenizer
gives these a meaning, and no whitespace strip removes them)."""


class ChatTemplate:
    """A model's chat template and tokenizer (thread-safe).

    Args:
        path: the model's checkpoint directory.
        template: a Jinja chat template to use instead of the checkpoint's (vLLM's ``--chat-template``).
        kwargs: extra variables for every rendering (vLLM's ``chat_template_kwargs``, e.g.
            ``{"enable_thinking": false}``); a request's own ``chat_template_kwargs`` win over them.
    """

    def __init__(self, path: str | Path, template: str | None = None, kwargs: dict[str, Any] | None = None) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.hf = AutoTokenizer.from_pretrained(str(self.path))
        self.template = template or self.hf.chat_template
        if not self.template:
            raise ValueError(f"{path}: the model has no chat template (ChatTemplate.of returns None for it)")
        self.kwargs = dict(kwargs or {})
        self.tokenizer = self.hf.backend_tokenizer
        """The fast (``tokenizers``) tokenizer the ids come from."""
        specials = sorted({t.content for t in self.hf.added_tokens_decoder.values() if t.special}, key=len,
                          reverse=True)
        self._special = re.compile("|".join(map(re.escape, specials))) if specials else None
        # encode_special_tokens is a property of the shared tokenizer: one encoding at a time.
        self._lock = threading.Lock()

    @classmethod
    def of(cls, path: str | Path, template: str | None = None,
           kwargs: dict[str, Any] | None = None) -> ChatTemplate | None:
        """The model's template, or ``None`` if it has none and no override is given."""
        if template is None and not has_chat_template(path):
            return None
        return cls(path, template, kwargs)

    def text(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
             kwargs: dict[str, Any] | None = None) -> str:
        """The rendered prompt, as ``apply_chat_template(..., tokenize=False)`` gives it."""
        try:
            return self.hf.apply_chat_template(list(messages), chat_template=self.template, tokenize=False,
                                               add_generation_prompt=add_generation_prompt,
                                               **(self.kwargs | (kwargs or {})))
        except Exception as e:  # noqa: BLE001 - jinja2's TemplateError, a template's raise_exception, ...
            raise InvalidRequest(f"messages: the model's chat template refused them: {e}") from None

    def ids(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
            kwargs: dict[str, Any] | None = None) -> list[int]:
        """The prompt's ids: the rendered template with its special tokens, contents as plain text."""
        return self.encode(messages, add_generation_prompt=add_generation_prompt, kwargs=kwargs)[1]

    def encode(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
               kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
        """The rendered prompt (as ``text`` gives it) and its ids (as ``ids``)."""
        stood_in: list[str] = []

        def stand_in(match: re.Match) -> str:
            stood_in.append(match.group(0))
            return chr(_PRIVATE + len(stood_in) - 1)

        safe = [self._defang(m, stand_in) for m in messages] if self._special else list(messages)
        text = self.text(safe, add_generation_prompt=add_generation_prompt, kwargs=kwargs)
        if not stood_in:
            with self._lock:
                return text, self.tokenizer.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        pieces = re.split(f"([{chr(_PRIVATE)}-{chr(_PRIVATE + len(stood_in) - 1)}])", text)
        with self._lock:
            for i, piece in enumerate(pieces):
                if not piece:
                    continue
                if i % 2:  # a stood-in string: plain text
                    self.tokenizer.encode_special_tokens = True
                    try:
                        ids += self.tokenizer.encode(stood_in[ord(piece) - _PRIVATE], add_special_tokens=False).ids
                    finally:
                        self.tokenizer.encode_special_tokens = False
                else:
                    ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
        return "".join(stood_in[ord(p) - _PRIVATE] if i % 2 else p for i, p in enumerate(pieces)), ids

    def generation_prompt(self, kwargs: dict[str, Any] | None = None) -> str | None:
        """The text ``add_generation_prompt`` appends to a conversation (``"<|im_start|>assistant\\n"``),
        or ``None`` if the template does not simply append one (then no prompt is known to end with it)."""
        probe = [{"role": "user", "content": "x"}]
        try:
            bare = self.text(probe, add_generation_prompt=False, kwargs=kwargs)
            full = self.text(probe, add_generation_prompt=True, kwargs=kwargs)
        except InvalidRequest:  # a template that wants other messages (a system one first, ...)
            return None
        return full[len(bare):] if full.startswith(bare) and len(full) > len(bare) else None

    def _defang(self, message: dict[str, Any], stand_in) -> dict[str, Any]:
        content = message.get("content")
        if isinstance(content, str):
            return message | {"content": self._special.sub(stand_in, content)}
        if isinstance(content, list):  # content parts: {"type": "text", "text": ...}
            parts = [p | {"text": self._special.sub(stand_in, p["text"])}
                     if isinstance(p, dict) and isinstance(p.get("text"), str) else p for p in content]
            return message | {"content": parts}
        return message


def has_chat_template(path: str | Path) -> bool:
    """Whether the checkpoint at ``path`` carries a chat template (``chat_template.jinja``, or
    ``chat_template`` in ``tokenizer_config.json``), read without loading its tokenizer."""
    path = Path(path)
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def end_of_turn_ids(path: str | Path) -> tuple[int, ...]:
    """Every id that ends a turn of the checkpoint at ``path``: ``config.json``'s and
    ``generation_config.json``'s ``eos_token_id`` (an id or a list: Llama 3's ``<|eot_id|>`` and
    ``<|eom_id|>``, Qwen's ``<|im_end|>`` and ``<|endoftext|>``) and the tokenizer's ``eos_token``, as
    vLLM stops on them (its ``--generation-config auto``); read without loading the tokenizer."""
    path = Path(path)
    ids: list[int] = []

    def read(name: str) -> dict[str, Any]:
        try:
            data = json.loads((path / name).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    for name in ("config.json", "generation_config.json"):
        eos = read(name).get("eos_token_id")
        for i in eos if isinstance(eos, list) else [eos]:
            if isinstance(i, int) and not isinstance(i, bool) and i not in ids:
                ids.append(i)
    eos = read("tokenizer_config.json").get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str):
        tokenizer = read("tokenizer.json")
        added = {t.get("content"): t.get("id") for t in tokenizer.get("added_tokens") or []}
        vocab = (tokenizer.get("model") or {}).get("vocab")
        i = added.get(eos, vocab.get(eos) if isinstance(vocab, dict) else None)
        if isinstance(i, int) and i not in ids:
            ids.append(i)
    return tuple(ids)
