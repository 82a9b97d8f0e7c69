"""``WordIds``: a byte-level BPE tokenizer's ids for ASCII text, from a cache of each word's ids.

Why: on the fast lane's door a first token waits for its prompt's ids, and HF tokenizers' ``encode``
is slow there with the caches cold (as a model step leaves them), most of it in its regex: a few
percent of a warm first token (docs/front-doors.md). A prompt's words recur (code repeats its
names), and BPE never merges across a word's edge, so a word's ids can be kept and reused.

Exact, not approximate. HF tokenizers encodes a text as: the pre-tokenizer cuts it into words, the
model (BPE) maps each word to ids on its own, and the post-processor adds the special tokens around
them. ``WordIds`` does the same for the shipped tokenizers' recipe, and only that recipe: no
normalizer, pre-tokenizer ``Split("\\n", isolated)`` then ``ByteLevel`` with GPT-2's regex and no
prefix space, a BPE model without dropout, and a post-processor that only adds tokens before and
after the text (checked on probe texts against the tokenizer itself). The regex is GPT-2's written
for ASCII (``\\p{L}`` is ``[A-Za-z]``, ``\\p{N}`` ``[0-9]``, ``\\s`` the six ASCII spaces that
Unicode calls White_Space), so it runs in Python's own ``re``; a word's ids are the tokenizer's own
BPE of its bytes (``Tokenizer.model.tokenize``). Any other text (non-ASCII, or holding an added
token such as ``<|bos|>``, which the tokenizer matches before pre-tokenizing) and any other
tokenizer go to ``Tokenizer.encode`` itself. ``tests/serve/test_word_ids.py`` compares the two.
"""

from __future__ import annotations

import json
import re

from tokenizers import Tokenizer

MAX_WORDS = 65_536
"""Words kept at most (then the cache starts again): a few MB."""
MAX_WORD_CHARS = 64
"""Longer words are not kept (BPE's cost grows with them, and they rarely recur)."""

_WS = "\t\n\x0b\x0c\r "
_WORD = re.compile(rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+""")
"""GPT-2's pre-tokenizer regex (HF ``ByteLevel(use_regex=True)``) for ASCII text."""


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character map (HF ``ByteLevel``): a word's bytes as BPE sees them.
    Printable Latin-1 bytes stand for themselves; the others, in order, for 256, 257, ..."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    moved = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(moved)) for b in range(256)]


_BYTE = _bytes_to_unicode()


def byte_level_bpe(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` is the recipe ``WordIds`` reproduces (its JSON; the post-processor is
    checked by ``WordIds`` on probe texts)."""
    spec = json.loads(tokenizer.to_str())
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    return (spec.get("normalizer") is None and model.get("type") == "BPE" and not model.get("dropout")
            and parts is not None and len(parts) == 2
            and parts[0] == {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Isolated", "invert": False}
            and parts[1].get("type") == "ByteLevel" and parts[1].get("use_regex") is True
            and parts[1].get("add_prefix_space") is False)


class WordIds:
    """``encode(text)``: exactly ``tokenizer.encode(text).ids``, from kept words' ids where it can.

    Args:
        tokenizer: an HF tokenizer; one of another recipe is always used whole (``fast`` false).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._words: dict[str, list[int]] = {}
        self._added = [t.content for t in tokenizer.get_added_tokens_decoder().values()]
        self.prefix, self.suffix = self._around()
        self.fast = byte_level_bpe(tokenizer) and self.prefix is not None
        """Whether ASCII texts take the kept words' way (else every text is the tokenizer's)."""
        if self.fast:
            self._newline = self._bpe("\n")
            self.fast = self._agrees()

    def _around(self) -> tuple[list[int] | None, list[int] | None]:
        """The special tokens the post-processor puts before and after a text's ids."""
        whole = self.tokenizer.encode("x = 1").ids
        plain = self.tokenizer.encode("x = 1", add_special_tokens=False).ids
        for i in range(len(whole) - len(plain) + 1):
            if whole[i:i + len(plain)] == plain:
                return whole[:i], whole[i + len(plain):]
        return None, None

    def _agrees(self) -> bool:
        probes = ["", "def f(x):\n    return x  \n\n\t", "It's 12 o'clock, isn't it?\r\n  y=[1,2]  "]
        return all(self._fast(p, True) == self.tokenizer.encode(p).ids for p in probes)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (a new list), as ``tokenizer.encode(text, add_special_tokens).ids``."""
        if self.fast and text.isascii() and not any(a in text for a in self._added):
            return self._fast(text, add_special_tokens)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _fast(self, text: str, special: bool) -> list[int]:
        ids = list(self.prefix) if special else []
        words = self._words
        for k, line in enumerate(text.split("\n")):  # Split("\n", isolated): each "\n" is a word
            if k:
                ids += self._newline
            for word in _WORD.findall(line):
                got = words.get(word)
                ids += got if got is not None else self._bpe(word)
        if special:
            ids += self.suffix
        return ids

    def _bpe(self, word: str) -> list[int]:
        ids = [t.id for t in self.tokenizer.model.tokenize("".join(_BYTE[b] for b in word.encode()))]
        if len(word) <= MAX_WORD_CHARS:
            if len(self._words) >= MAX_WORDS:
                self._words.clear()
            self._words[word] = ids
        return ids


__all__ = ["WordIds", "byte_level_bpe"]
