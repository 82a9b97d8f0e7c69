"""The WebSocket protocol's events as pydantic models: the source of ``docs/protocol.schema.json``.

The gateway builds events as plain dicts on the hot path; tests validate what it actually sends
against the schemas generated from these models, and check that the committed schema file is
current (``python -m serve.protocol > docs/protocol.schema.json`` regenerates it).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .request import GenerateRequest

VERSION = "fastmode.responses.v1"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResponseCreate(GenerateRequest):
    """Client -> server: start a response. Every ``GenerateRequest`` field, plus ``type``; ``id`` is required."""

    model_config = ConfigDict(extra="forbid", title="response.create")
    type: Literal["response.create"]
    id: str = Field(min_length=1, max_length=128, description="Client-chosen; unique among this "
                    "connection's responses in flight.")


class ResponseCancel(_Event):
    """Client -> server: stop a response in flight (its engine sequence is freed)."""

    model_config = ConfigDict(extra="forbid", title="response.cancel")
    type: Literal["response.cancel"]
    id: str


class Route(_Event):
    by: Literal["model", "auto"]
    difficulty: float | None = Field(default=None, description="model=auto: the prompt's difficulty score.")
    threshold: float | None = Field(default=None, description="model=auto: the fast lane's threshold.")
    fast_when: Literal["easy", "hard"] | None = Field(default=None, description="model=auto: which side of "
                                                      "the threshold goes to the fast lane (easy: at most it; "
                                                      "hard: above it).")
    spilled_from: Literal["priority", "exact"] | None = Field(default=None, description="Served on standard "
                                                              "because that lane was full and allow_spill was set, "
                                                              "or auto had routed it there.")


class ResponseCreated(_Event):
    """Server -> client: the response was admitted to a lane."""

    model_config = ConfigDict(extra="forbid", title="response.created")
    type: Literal["response.created"]
    id: str
    lane: Literal["fast", "priority", "standard", "exact"]
    model: str
    input_tokens: int = Field(ge=1)
    route: Route
    protocol: Literal["fastmode.responses.v1"]


class TopLogprob(_Event):
    token: str = Field(description="The token decoded alone (special tokens included).")
    id: int = Field(ge=0)
    logprob: float = Field(description="Of the model's raw logits (before penalties, biases, temperature).")


class TokenLogprob(TopLogprob):
    """One output token's log probability, and the request's ``logprobs`` most likely tokens', most likely first."""

    top_logprobs: list[TopLogprob]


class OutputTextDelta(_Event):
    """Server -> client: new text. ``seq`` numbers this response's deltas 0, 1, 2, ... with no gap."""

    model_config = ConfigDict(extra="forbid", title="response.output_text.delta")
    type: Literal["response.output_text.delta"]
    id: str
    seq: int = Field(ge=0)
    delta: str = Field(description="New text; empty only in a delta that carries logprobs of tokens without "
                       "text of their own yet (a special token, part of a character).")
    tokens: int | None = Field(default=None, ge=0, description="Output tokens whose text this delta carries "
                               "(a client's live tokens/s; the completed event's usage is the exact total).")
    logprobs: list[TokenLogprob] | None = Field(default=None, description="With the request's logprobs: one "
                                                "entry per output token since the previous delta.")


class InputTokensDetails(_Event):
    cached_tokens: int = Field(ge=0, description="Input tokens whose keys and values were reused from an "
                               "earlier request (prefix caching: a conversation's history), not prefilled again.")


class Usage(_Event):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    input_tokens_details: InputTokensDetails


class Timing(_Event):
    ttft_s: float | None = Field(description="Router entry to first text, seconds.")
    engine_ttft_s: float | None = Field(description="Lane entry to first token, seconds.")
    decode_tokens_per_s: float | None = Field(description="Output tokens after the first, per second.")
    total_s: float = Field(description="Router entry to the end, seconds.")


class HopPair(_Event):
    """Every chip-to-chip hop of one response's engine steps from chip ``src`` to chip ``dst``."""

    src: str = Field(description="Sending chip, 'NODE_IP/chipN'.")
    dst: str = Field(description="Receiving chip.")
    count: int = Field(ge=1, description="Hops (one per engine step that crossed this pair).")
    seconds: float = Field(ge=0, description="Their seconds in total (receiver's clock on entry minus sender's "
                           "send time).")
    max_seconds: float = Field(ge=0, description="The slowest one, seconds.")
    bytes: int = Field(ge=0, description="Their payload in total.")


class Speculative(_Event):
    """The exact lane's speculative decoding of one response: the fast model drafted, the full model
    verified."""

    draft_tokens: int = Field(ge=1, description="The most tokens a verify step's draft holds (the "
                              "configured k; adaptive k drafts 0 to k each step).")
    verify_steps: int = Field(ge=0, description="Forward passes of the full model that verified drafts.")
    drafted: int = Field(ge=0, description="Draft tokens proposed in all.")
    accepted: int = Field(ge=0, description="Draft tokens the full model kept.")
    acceptance_rate: float = Field(ge=0, le=1, description="accepted / drafted.")
    tokens_per_step: float = Field(ge=1, description="Output tokens per verify step (the full model's own "
                                   "token included): the speed-up over one token per step, before costs.")


class ResponseCompleted(_Event):
    """Server -> client: the response ended normally; the last event of its id."""

    model_config = ConfigDict(extra="forbid", title="response.completed")
    type: Literal["response.completed"]
    id: str
    finish_reason: Literal["stop", "length"]
    usage: Usage
    timing: Timing
    cost_units: float = Field(ge=0, description="price x total tokens / 1000 (lane prices in the config).")
    lane: Literal["fast", "priority", "standard", "exact"]
    model: str
    hops: list[HopPair] | None = Field(default=None, description="Fast lane only: every chip-to-chip hop of "
                                       "this response's steps, per chip pair (sorted by sender, receiver).")
    speculative: Speculative | None = Field(default=None, description="Exact lane only: its drafts and "
                                            "their acceptance.")


class ResponseCancelled(_Event):
    """Server -> client: the response was cancelled (``response.cancel``); the last event of its id."""

    model_config = ConfigDict(extra="forbid", title="response.cancelled")
    type: Literal["response.cancelled"]
    id: str


class ErrorEvent(_Event):
    """Server -> client: a request failed (the last event of its id) or a frame was refused (``id`` null)."""

    model_config = ConfigDict(extra="forbid", title="error")
    type: Literal["error"]
    id: str | None
    code: str = Field(description="Stable error code (docs/protocol.md lists them).")
    message: str
    retry_after: float | None = Field(default=None, description="overloaded, rate_limited: seconds to wait "
                                      "before retrying.")


CLIENT_EVENTS = (ResponseCreate, ResponseCancel)
SERVER_EVENTS = (ResponseCreated, OutputTextDelta, ResponseCompleted, ResponseCancelled, ErrorEvent)


def schema() -> dict[str, Any]:
    """One JSON Schema per event type, keyed by ``type``."""
    return {"protocol": VERSION, "client_to_server": {m.model_config["title"]: m.model_json_schema() for m in CLIENT_EVENTS},
            "server_to_client": {m.model_config["title"]: m.model_json_schema() for m in SERVER_EVENTS}}


if __name__ == "__main__":
    print(json.dumps(schema(), indent=2))
