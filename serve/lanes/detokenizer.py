"""``TextStream``: incremental detokenization with stop strings, for engines that emit token ids.

Decoding goes through ``tokenizers``' ``DecodeStream`` (what vLLM uses too), so a multi-byte
character split across tokens appears once it is whole. Stop strings follow vLLM's rules: the
text ends right before the first stop string, and up to ``len(longest stop) - 1`` characters are
held back while they could still be the start of one; with ``min_tokens`` a stop string counts only
if it ends after the text of the first ``min_tokens`` tokens. A stop token (an eos, a
``stop_token_ids`` id) that ended the sequence adds no text (``push(..., stop_token=True)``), as
vLLM's detokenizer without ``include_stop_str_in_output``. Tokens pushed together after the one
whose text completes a stop string (a step that produced several: the exact tier's accepted drafts,
the fast lane's bundled tokens) are not part of the output: ``kept`` says how many of the last push
are, and the engines drop the rest with their log probabilities, as vLLM's output processor
(``_trim_surplus_tokens``).
"""

from __future__ import annotations

from bisect import bisect_left

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TextStream:
    """Turns a request's new token ids into new text; ``stopped`` once a stop string appears."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | None = None,
                 prompt_ids: list[int] | None = None, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        # ``prompt_ids``: decode the output in its prompt's context, as vLLM's detokenizer primes its stream
        self._decoder = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
        self._text = ""  # everything decoded so far (up to a stop string once stopped)
        self._sent = 0  # characters of _text already returned
        self.stopped = False
        self._min_tokens, self._tokens = min_tokens, 0
        self._min_end = 0 if min_tokens == 0 else None
        """Characters of the first ``min_tokens`` tokens' text, once decoded: a stop string must end past them."""
        self.kept = 0
        """How many of the last ``push``'s tokens the output has: all of them, unless a stop string ended
        it, then those up to the one whose text completes it (vLLM's ``num_kept``)."""

    def push(self, token_ids: list[int], stop_token: bool = False) -> str:
        """Decode ``token_ids``; return the text that is now safe to send (may be empty).
        ``stop_token``: the last of them ended the sequence (its text is not decoded)."""
        if self.stopped:
            self.kept = 0
            return ""
        self.kept = len(token_ids)
        start = len(self._text)
        offsets = [start]  # the text's length before the first token and after each one
        for t in token_ids[:-1] if stop_token else token_ids:
            piece = self._decoder.step(self.tokenizer, t)
            if piece:
                self._text += piece
            offsets.append(len(self._text))
            self._tokens += 1
            if self._min_end is None and self._tokens >= self._min_tokens:
                self._min_end = len(self._text)
        if self.stop and self._min_end is not None:
            # A stop string may straddle the previous text; search from where it could begin.
            lo = max(0, start - self._hold)
            hits = [(i, i + len(s)) for i, s in ((self._text.find(s, max(lo, self._min_end - len(s) + 1)), s)
                                                 for s in self.stop) if i >= 0]
            if hits:
                at, end = min(hits)
                self._text = self._text[:at]
                self.stopped = True
                self.kept = min(bisect_left(offsets, end, lo=1), len(offsets) - 1)
                return self.flush()
        end = len(self._text) - self._hold if self.stop else len(self._text)
        if end <= self._sent:
            return ""
        out, self._sent = self._text[self._sent:end], end
        return out

    def flush(self) -> str:
        """The held-back text, at the end of the sequence."""
        out, self._sent = self._text[self._sent:], len(self._text)
        return out
