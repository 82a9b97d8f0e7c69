"""Multi-turn: responses kept for ``previous_response_id``, and the history a new turn continues.

A response that completes is kept with its conversation: every input message that led to it and
its own output as an ``assistant`` message. A later ``response.create`` that names it in
``previous_response_id`` sends only the new input; the router joins the kept messages and the new
ones, exactly the ``input`` a client re-sending the whole history as messages would send (same
text, so the same token ids), and the lane's prefix cache finds the history's keys and values.

Kept where: every WebSocket connection keeps its own responses (``gateway.responses_per_connection``
and ``..._bytes_per_connection``), and a response created with ``store: true`` is also kept by the
application's ``responses`` deployment (``StoredResponses``: ``gateway.stored_responses``,
``gateway.stored_response_bytes``), where every front door finds it: any WebSocket connection of any
gateway replica, ``POST /v1/generate`` and gRPC. Both are bounded and evict oldest first; an id that
is unknown, evicted or still streaming gets ``previous_response_not_found``.

Whose: a stored response is found only with the API key that created it (its ``owner``, a digest of
the key, ``serve.auth.owner_of``). Another key gets ``previous_response_not_found``, as for an id that
was never there, so an id learned from a log or a trace reads nothing. Without keys (loopback only)
every caller is the same owner.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sharding import cpus

from .errors import FastmodeError


class PreviousResponseNotFound(FastmodeError, ValueError):
    """``previous_response_id`` names no completed response kept here (unknown, evicted, or from
    another connection without ``store: true``): re-send the whole history as ``input``."""

    code = "previous_response_not_found"
    status = 400


Messages = tuple[tuple[str, str], ...]
"""A conversation: ``(role, content)`` pairs, oldest first."""


@dataclass(frozen=True)
class Turn:
    """A completed response and the conversation it ends."""

    id: str
    messages: Messages
    """Every input message of the conversation so far, then this response's output (``assistant``)."""
    lane: str
    """The lane that served it (the next turn prefers the same lane's replica that holds its prefix)."""
    replica: str | None
    """That lane replica's id, when known (``serve.lanes.lane_links``)."""
    owner: str = ""
    """Who may continue it: ``serve.auth.owner_of`` of the creator's API key."""

    @property
    def nbytes(self) -> int:
        return sum(len(role) + len(content.encode()) for role, content in self.messages)


def as_messages(value: str | list[Any]) -> Messages:
    """A request's ``input`` as a conversation: a string is one ``user`` message."""
    if isinstance(value, str):
        return (("user", value),)
    out = []
    for m in value:
        role, content = (m.role, m.content) if hasattr(m, "role") else (m["role"], m["content"])
        out.append((role, content))
    return tuple(out)


def to_input(messages: Messages) -> list[dict[str, str]]:
    """A conversation as a request's ``input`` (what a client re-sending it whole would send)."""
    return [{"role": role, "content": content} for role, content in messages]


class ResponseStore:
    """Completed turns by response id, bounded by count and bytes, oldest evicted first.

    Args:
        max_responses: turns kept at most.
        max_bytes: their messages' bytes at most (a conversation's history counts once per turn
            kept; a single turn larger than this is not kept).
    """

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._turns: OrderedDict[str, Turn] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, rid: str) -> bool:
        return rid in self._turns

    def put(self, turn: Turn) -> None:
        """Keep ``turn`` (replacing one of the same id), evicting the oldest beyond the bounds."""
        self._pop(turn.id)
        size = turn.nbytes
        if size > self.max_bytes or self.max_responses < 1:
            return
        self._turns[turn.id] = turn
        self.nbytes += size
        while len(self._turns) > self.max_responses or self.nbytes > self.max_bytes:
            self._pop(next(iter(self._turns)))

    def get(self, rid: str, owner: str = "") -> Turn | None:
        """The turn ``rid`` if ``owner`` owns it."""
        turn = self._turns.get(rid)
        return turn if turn is not None and hmac.compare_digest(turn.owner, owner) else None

    def _pop(self, rid: str) -> None:
        turn = self._turns.pop(rid, None)
        if turn is not None:
            self.nbytes -= turn.nbytes


class StoredResponses:
    """The Serve deployment (one replica) keeping the responses created with ``store: true`` for
    every front door (each front door's router puts and gets here; a few hundred microseconds a call,
    paid only by requests that use ``store`` or continue a stored response)."""

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        cpus.place("serving")  # FASTMODE_CPUS, from serve.app.actor_options
        self.store = ResponseStore(max_responses, max_bytes)

    def put(self, turn: Turn) -> None:
        self.store.put(turn)

    def get(self, rid: str, owner: str = "") -> Turn | None:
        return self.store.get(rid, owner)

    def stats(self) -> dict[str, int]:
        return {"responses": len(self.store), "bytes": self.store.nbytes}


def not_found(rid: str) -> PreviousResponseNotFound:
    return PreviousResponseNotFound(
        f"previous_response_id {rid!r} names no completed response kept here (unknown, evicted, still "
        "streaming, or created on another connection without store: true); re-send the whole conversation "
        "as input (its messages and each response's output as an 'assistant' message)")


def find(rid: str, *stores: ResponseStore | None) -> Turn:
    """The turn ``rid`` from the first store that keeps it; ``PreviousResponseNotFound`` otherwise."""
    for store in stores:
        if store is not None and (turn := store.get(rid)) is not None:
            return turn
    raise not_found(rid)
