"""The request every front door turns into, and the events a stream yields.

A stream of events for one request, in order (``protocol.md`` will give their wire form):

- ``{"type": "created", "id", "lane", "model", "input_tokens", "route"}``: admitted to a lane
  (``route``: ``{"by": "model"|"auto", "difficulty"?, "threshold"?, "spilled_from"?}``);
- ``{"type": "delta", "id", "seq", "text", "tokens"}``: coalesced new text (``seq`` counts from 0);
- ``{"type": "done", "id", "finish_reason", "usage", "timing", "cost_units", "lane", "model", "route"}``;
- or, at any point, ``{"type": "error", "id", "code", "message", "status"[, "retry_after"]}``.

Every stream ends with exactly one ``done`` or ``error``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from .errors import InvalidRequest, UnsupportedParameter, describe_validation

_Text = Annotated[str, StringConstraints(min_length=1)]
_TokenId = Annotated[int, Field(ge=0, lt=2**31)]
_Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` entry of OpenAI's Responses API that asks for the output's log probabilities."""

MODEL_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty")
"""The sampling fields a model's ``generation_config.json`` gives defaults to (vLLM's
``get_diff_sampling_param``): a request that leaves one unset gets the model's value, else the engines'."""


class Message(BaseModel):
    """A chat message: rendered by the lane's model's chat template, or joined (``join_messages``)
    for a model without one (the shipped models: see ``GenerateRequest.prompt``)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str


class GenerateRequest(BaseModel):
    """One generation, as the router receives it (the fields of a WebSocket ``response.create``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(default=None, min_length=1, max_length=128, description=
                           "Client-chosen request id; the router makes one up when absent.")
    model: str = Field(min_length=1, description="A served model id, or 'auto'.")
    service_tier: str | None = Field(default=None, description="'priority', 'exact', 'default' or 'auto' "
                                     "(= 'default'; with model 'auto', the router's auto_full_tier): which "
                                     "lane serves the full model.")
    input: str | list[Message] = Field(description="The prompt (text the model continues as it is), or chat "
                                       "messages (rendered by the model's chat template; joined one per line "
                                       "for a model without one).")
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, description="Extra variables for the "
                                                        "model's chat template (vLLM's, e.g. {\"enable_thinking\": "
                                                        "false}); with chat messages (or previous_response_id) only, "
                                                        "on a model that has a template.")
    max_output_tokens: int | None = Field(default=None, ge=1, description="Default: the model's generation_config.json "
                                          "max_new_tokens (vLLM's default max_tokens), capped by the rest of the "
                                          "context window; without one, the rest of the context window.")
    # Unset (None), a field of MODEL_DEFAULTS takes the model's generation_config.json value, else the
    # engines' (sharding.sampling.SamplingParams), as vLLM's server with --generation-config auto.
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False, description=
                                      "0 (below 1e-5, as in vLLM) is greedy; unset: the model's generation_config.json "
                                      "value, else 1.0 (OpenAI's).")
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, description="Unset: the model's, else 1.")
    top_k: int | None = Field(default=None, ge=-1, description="vLLM's: keep the k most likely tokens; 0 or -1: all. "
                              "Unset: the model's, else all.")
    min_p: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False, description="vLLM's: drop tokens less "
                                "likely than min_p times the most likely one. Unset: the model's, else 0.")
    repetition_penalty: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="vLLM's: > 1 "
                                             "discourages the prompt's and the output's tokens. Unset: the model's, else 1.")
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False, description="OpenAI's: "
                                           "subtracted from the logit of each token the output holds. Unset: the "
                                           "model's, else 0.")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2, allow_inf_nan=False, description="OpenAI's: "
                                            "subtracted once per time the output holds a token. Unset: the model's, "
                                            "else 0.")
    logit_bias: dict[_TokenId, _Bias] | None = Field(default=None, description="OpenAI's: token id -> bias in "
                                                     "[-100, 100], added to its logit.")
    stop: _Text | list[_Text] | None = Field(default=None, description="Up to 4 stop strings; the "
                                              "text ends before the first one (which is not returned).")
    stop_token_ids: list[_TokenId] | None = Field(default=None, description="vLLM's: more token ids that end the "
                                                  "output (even with ignore_eos); their text is not returned.")
    min_tokens: int = Field(default=0, ge=0, description="vLLM's: the output has at least this many tokens (eos and "
                            "stop tokens are not sampled before, stop strings do not end it before).")
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    logprobs: int | None = Field(default=None, ge=0, le=20, description="Each output token's log probability "
                                 "(of the model's raw logits, as vLLM's) with those of the n most likely tokens "
                                 "(0: its own only), in the deltas' 'logprobs'.")
    top_logprobs: int | None = Field(default=None, ge=0, le=20, description="OpenAI Responses': with include "
                                     "['message.output_text.logprobs'], how many most likely tokens each output "
                                     "token's entry lists (as logprobs: n).")
    include: list[str] | None = Field(default=None, description="OpenAI Responses': "
                                      f"{LOGPROBS_INCLUDE!r} asks for logprobs (top_logprobs of them, else 0); no "
                                      "other value is served.")
    ignore_eos: bool = Field(default=False, description="Keep generating past end-of-sequence tokens "
                             "(vLLM's extension; benchmarks use it for fixed output lengths).")
    allow_spill: bool = Field(default=False, description="If the priority or exact lane is "
                              "full, serve on standard instead of failing with 'overloaded' (model 'auto' always does).")
    metadata: dict[str, str] | None = Field(default=None, description="Opaque; may carry 'traceparent'.")
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128, description=
                                             "Continue the conversation of this completed response: its "
                                             "input and output come first, then this request's input (as if "
                                             "re-sent whole as messages). See serve.conversation.")
    store: bool = Field(default=False, description="Also keep this response where any connection of this "
                        "gateway (and its HTTP API) can continue it by id, not only this connection.")

    @classmethod
    def parse(cls, data: Any, source: bytes | None = None) -> GenerateRequest:
        """Validate ``data`` (a dict or a ``GenerateRequest``); ``InvalidRequest`` names the bad field.

        ``source``: the UTF-8 JSON ``data`` was read from, if at hand. UTF-8 cannot carry a lone
        surrogate, only a ``\\u`` escape in it can make one, so without one the check for them is
        skipped (it dumps the request and walks every string: on the fast lane's door,
        ``serve.lanes.door``, a first token waits for it)."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise InvalidRequest(f"a request must be a JSON object, got {type(data).__name__}")
        try:
            req = cls.model_validate(data)
        except ValidationError as e:
            extra = [err for err in e.errors() if err["type"] == "extra_forbidden"]
            if extra:  # a field no front door maps: not implemented here, never dropped
                raise UnsupportedParameter(f"{'.'.join(map(str, extra[0]['loc']))}: unknown parameter, "
                                           "not supported by this server") from None
            raise InvalidRequest(describe_validation(e.errors(), "(request)")) from None
        if req.chat_template_kwargs is not None and isinstance(req.input, str) and req.previous_response_id is None:
            raise InvalidRequest("chat_template_kwargs: a text input is not rendered by a chat template; send "
                                 "chat messages")
        if req.max_output_tokens is not None and req.min_tokens > req.max_output_tokens:
            raise InvalidRequest(f"min_tokens: must be at most max_output_tokens ({req.max_output_tokens}), got "
                                 f"{req.min_tokens}")
        req = req._resolve_include()
        if isinstance(req.stop, list) and len(req.stop) > 4:
            raise InvalidRequest(f"stop: at most 4 stop strings, got {len(req.stop)}")
        escaped = source is None or b"\\u" in source
        if escaped and (where := _not_unicode(req.model_dump(exclude_none=True))) is not None:
            # JSON may carry lone surrogates (an unpaired "\\ud800" escape); no tokenizer takes them.
            raise InvalidRequest(f"{where}: not valid Unicode text (a lone surrogate)")
        return req

    def _resolve_include(self) -> GenerateRequest:
        """OpenAI Responses' ``include`` and ``top_logprobs`` as ``logprobs`` (``logprobs_of``)."""
        if self.include is None and self.top_logprobs is None:
            return self
        return self.model_copy(update={"logprobs": logprobs_of(self.include, self.top_logprobs, self.logprobs)})

    def to_lane(self, request_id: str, trace: dict[str, str] | None = None) -> LaneRequest:
        """What the router sends a lane: this request's generation fields, every default resolved."""
        return LaneRequest(request_id=request_id, prompt=self.prompt, max_output_tokens=self.max_output_tokens,
                           **{name: getattr(self, name) for name in MODEL_DEFAULTS}, seed=self.seed,
                           logit_bias=self.logit_bias, stop=tuple(self.stop_list),
                           stop_token_ids=tuple(self.stop_token_ids or ()), min_tokens=self.min_tokens,
                           logprobs=self.logprobs, ignore_eos=self.ignore_eos, trace=trace)

    @property
    def stop_list(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def prompt(self) -> str | ChatPrompt:
        """What the lane makes its prompt ids of (``serve.lanes.prompt_ids.PromptIds.encode_prompt``):
        the input string as it is, or the messages as a ``ChatPrompt``. A conversation without any
        text is as empty as an empty string, whatever the model's template would make of it."""
        if isinstance(self.input, str):
            if not self.input:
                raise InvalidRequest("input: the prompt is empty")
            return self.input
        messages = tuple((m.role, m.content) for m in self.input)
        if not any(content for _, content in messages):
            raise InvalidRequest("input: the prompt is empty")
        return ChatPrompt(messages, self.chat_template_kwargs)


def logprobs_of(include: list[str] | None, top_logprobs: int | None, logprobs: int | None = None) -> int | None:
    """OpenAI Responses' ``include`` and ``top_logprobs`` as the router's ``logprobs``, as vLLM's Responses
    API reads them: ``include`` with ``LOGPROBS_INCLUDE`` asks for log probabilities, ``top_logprobs``
    (default 0) says how many top tokens. Any other ``include`` entry is ``unsupported_parameter``;
    ``top_logprobs`` above 0 without that entry (vLLM would drop it), or a ``logprobs`` that says
    otherwise, is ``invalid_request``."""
    include = include or []
    if other := [i for i in include if i != LOGPROBS_INCLUDE]:
        raise UnsupportedParameter(f"include: {other[0]!r:.80} is not served; only {LOGPROBS_INCLUDE!r}")
    if LOGPROBS_INCLUDE not in include:
        if top_logprobs:
            raise InvalidRequest(f"top_logprobs: needs include: [{LOGPROBS_INCLUDE!r}]")
        return logprobs
    n = top_logprobs or 0
    if logprobs is not None and logprobs != n:
        raise InvalidRequest(f"logprobs: {logprobs} disagrees with include and top_logprobs ({n}); send one")
    return n


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation as a lane receives it: the lane's model's chat template renders it
    (``serve.chat.ChatTemplate``), or, for a model without one, its messages are joined
    (``join_messages``). Either way ``serve.lanes.prompt_ids.PromptIds.encode_prompt`` decides the ids."""

    messages: tuple[tuple[str, str], ...]
    """``(role, content)`` pairs, oldest first."""
    template_kwargs: dict[str, Any] | None = None
    """The request's ``chat_template_kwargs`` (over the model's configured ones)."""

    def joined(self) -> str:
        return join_messages(self.messages)


def join_messages(messages: Iterable[tuple[str, str]]) -> str:
    """The text ``(role, content)`` messages make for a model without a chat template: one message
    per line, but an ``assistant`` message that starts with a line break follows the message before
    it directly. That message is what the model continued the text before it with (a completion
    model's turn: a line's code, then ``"\\n    return x"``); another line break would put a blank
    line into the model's own text on the next turn, and make the lane prefill the previous
    output again instead of reusing its keys and values."""
    return "".join(content if i == 0 or (role == "assistant" and content.startswith("\n")) else "\n" + content
                   for i, (role, content) in enumerate(messages))


def _not_unicode(value: Any, where: str = "") -> str | None:
    """Where in ``value`` (a validated request's dump: dicts, lists, strings, numbers) the first
    string that is not valid Unicode is, or ``None``."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return where or "(request)"
    elif isinstance(value, dict):
        for k, v in value.items():
            key = f"{where}.{k}" if where else str(k)
            if _not_unicode(k) is not None:
                return f"{where or '(request)'} (a key)"
            if (bad := _not_unicode(v, key)) is not None:
                return bad
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (bad := _not_unicode(v, f"{where}.{i}")) is not None:
                return bad
    return None


@dataclass(frozen=True, kw_only=True)
class LaneRequest:
    """One request as a lane replica receives it from a front door's router (``GenerateRequest.to_lane``).

    Validated once, at the front door; no field has a default here, so no second default can
    disagree with ``GenerateRequest``'s. The lane makes ``prompt`` its model's prompt ids
    (``PromptIds.encode_prompt``) and resolves ``max_output_tokens`` against its context (``None``: the
    model's ``max_new_tokens`` or the rest of it, ``serve.lanes.sampling.output_budget``).
    """

    request_id: str
    prompt: str | ChatPrompt
    """Text to continue as it is (``/v1/completions``, a ``response.create`` with a string ``input``),
    or a conversation for the model's chat template."""
    max_output_tokens: int | None
    temperature: float | None
    """This and the other ``MODEL_DEFAULTS``: ``None`` when the request left it to the model's
    ``generation_config.json`` (the lane resolves it: ``serve.lanes.sampling``)."""
    top_p: float | None
    top_k: int | None
    min_p: float | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    seed: int | None
    logit_bias: dict[int, float] | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    """The request's own; the lane adds its model's end-of-turn ids unless ``ignore_eos``."""
    min_tokens: int
    logprobs: int | None
    ignore_eos: bool
    trace: dict[str, str] | None
    """The router span's W3C trace context (``telemetry.inject``), when tracing is on."""
