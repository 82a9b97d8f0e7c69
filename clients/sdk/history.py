"""The conversations of the responses this client completed, for ``previous_response_id`` across
connections.

The server keeps a completed response for ``previous_response_id`` on the connection it completed
on (and, with ``store: true``, for every connection), bounded and evicted oldest first. A client
that reconnects (the gateway restarted, an idle or aged connection was closed, a resubmit) would get
``previous_response_not_found`` for every turn it continues. So the client keeps each completed
response's conversation too, bounded the same way, and sends it whole as ``input`` where the server
no longer has it: the same messages the server would have joined (every input message so far, then
each response's output as an ``assistant`` message), so the same prompt tokens, and the lane's
prefix cache still finds them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

Message = dict[str, str]


def as_messages(value: Any) -> list[Message] | None:
    """A request's ``input`` as messages, as the server reads it (a string is one ``user`` message);
    ``None`` for an input the client cannot replay (the server will refuse it anyway)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        return None
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return None
        out.append({"role": m["role"], "content": m["content"]})
    return out


@dataclass(frozen=True)
class Kept:
    """A completed response: the connection it completed on, and its whole conversation."""

    connection: object
    messages: tuple[tuple[str, str], ...]
    stored: bool
    """Created with ``store: true``: every connection of the server finds it."""

    @property
    def nbytes(self) -> int:
        return sum(len(r) + len(c.encode()) for r, c in self.messages)


class History:
    """Completed responses by id, at most ``max_responses`` and ``max_bytes`` of text, oldest evicted."""

    def __init__(self, max_responses: int = 64, max_bytes: int = 4 * 2**20) -> None:
        if max_responses < 0 or max_bytes < 0:
            raise ValueError("history bounds must be at least 0")
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def conversation(self, body: dict[str, Any]) -> list[Message] | None:
        """The whole conversation a ``response.create`` body asks the model to continue (its
        previous response's, then its own input); ``None`` where the client does not know it."""
        new = as_messages(body.get("input"))
        prev = body.get("previous_response_id")
        if new is None or prev is None:
            return new
        kept = self._kept.get(prev)
        return None if kept is None else [{"role": r, "content": c} for r, c in kept.messages] + new

    def replay(self, body: dict[str, Any], connection: object, *, force: bool = False) -> dict[str, Any] | None:
        """``body`` with its ``previous_response_id`` replaced by the whole conversation as ``input``,
        when that response completed on another connection than ``connection`` without ``store``
        (or ``force``: the server said it no longer has it); ``None`` where nothing is to be replaced
        or the client does not know the conversation."""
        prev = body.get("previous_response_id")
        kept = self._kept.get(prev) if isinstance(prev, str) else None
        if kept is None or not force and (kept.connection is connection or kept.stored):
            return None
        conversation = self.conversation(body)
        if conversation is None:
            return None
        return {k: v for k, v in body.items() if k != "previous_response_id"} | {"input": conversation}

    def put(self, rid: str, conversation: list[Message], output: str, connection: object, stored: bool) -> None:
        """Keep response ``rid``: ``conversation`` (its input, whole) and its ``output`` text."""
        kept = Kept(connection, tuple((m["role"], m["content"]) for m in conversation) + (("assistant", output),),
                    stored)
        self._pop(rid)
        if self.max_responses == 0 or kept.nbytes > self.max_bytes:
            return
        self._kept[rid] = kept
        self._bytes += kept.nbytes
        while len(self._kept) > self.max_responses or self._bytes > self.max_bytes:
            self._pop(next(iter(self._kept)))

    def _pop(self, rid: str) -> None:
        kept = self._kept.pop(rid, None)
        if kept is not None:
            self._bytes -= kept.nbytes
