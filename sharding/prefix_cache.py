"""``PrefixCache``: the KV-cache slots of finished sequences, kept for a later prompt that starts
with the same tokens.

A multi-turn conversation re-sends its history every turn (or the gateway joins it from
``previous_response_id``): turn ``n + 1``'s prompt is turn ``n``'s prompt and output plus new
input. When turn ``n`` ends, its slot still holds the keys and values of every token it was fed
(the prompt and all but the last output token: the last one was sampled, never fed). Instead of
freeing the slot, the scheduler parks it here with those tokens; a new request whose prompt
starts with them takes the slot over and prefills only the rest.

Parked slots are still allocated in the ``SlotPool``; they count as free for admission: a request
that matches nothing takes a free slot, or, when none is left, the least recently parked one
(LRU). Matching is by token prefix of the whole slot, not by block: a slot holds one sequence, so
the longest common prefix of the prompt and a parked slot's tokens is reusable as is (positions
beyond it are overwritten before they are read, ``sharding.kv_cache``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .kv_cache import SlotPool

MIN_REUSE_TOKENS = 16
"""A match shorter than this does not take a parked slot while a free one is left: a shared first
line is not worth destroying another conversation's longer history for."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Parked slots and the tokens whose keys and values each holds, least recently parked first."""

    def __init__(self) -> None:
        self._slots: OrderedDict[int, list[int]] = OrderedDict()
        self.hits = 0
        """Requests that reused a parked slot (since start)."""
        self.reused_tokens = 0
        """Prompt tokens those requests did not prefill."""

    def __len__(self) -> int:
        return len(self._slots)

    def park(self, slot: int, tokens: list[int]) -> None:
        """Keep ``slot`` with ``tokens`` in it (its most recent use)."""
        self._slots.pop(slot, None)
        if tokens:
            self._slots[slot] = tokens

    def match(self, prompt: Sequence[int]) -> tuple[int | None, int]:
        """The parked slot sharing the longest prefix with ``prompt`` and how many tokens it can
        skip: at most ``len(prompt) - 1`` (the last prompt token is always fed, for its logits)."""
        best, best_n = None, 0
        for slot, tokens in self._slots.items():
            n = min(common_prefix(tokens, prompt), len(prompt) - 1)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def take(self, slot: int, reused: int = 0) -> int:
        """Remove ``slot`` (a new sequence owns it); ``reused``: the prompt tokens it skips."""
        del self._slots[slot]
        if reused:
            self.hits += 1
            self.reused_tokens += reused
        return slot

    def evict(self) -> int:
        """Remove the least recently parked slot and return it (its contents are given up)."""
        slot, _ = self._slots.popitem(last=False)
        return slot

    def stats(self) -> dict[str, int]:
        """``parked`` slots, ``hits`` and ``reused_tokens`` since start."""
        return {"parked": len(self._slots), "hits": self.hits, "reused_tokens": self.reused_tokens}


def place(prefix: PrefixCache | None, slots: SlotPool, prompt: Sequence[int]) -> tuple[int, int]:
    """``(slot, cached)`` for a new sequence: the parked slot holding most of ``prompt`` (``cached``
    of its tokens reusable), else a free slot, else the least recently parked one (given up).
    Call it only when ``slots.num_free or prefix`` (something to take)."""
    if prefix is not None:
        slot, n = prefix.match(prompt)
        if slot is not None and (n >= MIN_REUSE_TOKENS or not slots.num_free):
            return prefix.take(slot, n), n
        if not slots.num_free:
            return prefix.evict(), 0
    return slots.allocate(), 0


def release(prefix: PrefixCache | None, slots: SlotPool, slot: int, tokens: list[int]) -> None:
    """A sequence is done with ``slot``, whose cache holds ``tokens``: park it (with a prefix cache),
    else free it."""
    if prefix is not None:
        prefix.park(slot, tokens)
    else:
        slots.free(slot)
