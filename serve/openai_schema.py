"""The OpenAI API's request bodies (``/v1/chat/completions``, ``/v1/completions``) and their
translation into the router's ``GenerateRequest`` fields (``serve.request``).

No field is dropped. The fields below are honoured; a field this server does not implement is
refused with a 400 whose ``code`` is ``unsupported_parameter`` and whose ``param`` names it, unless
it holds its neutral value (``NEUTRAL``: e.g. ``n: 1``, ``logprobs: false``), which changes nothing,
or is one of ``NO_EFFECT`` (identifiers and cache hints that do not change the output). That covers
``n`` other than 1, tools, a non-text ``response_format``, ``echo``, ``suffix``,
``best_of``, and any field this API does not know. Non-text message parts and token-id prompts are
refused as invalid. The sampling fields are validated by the router, whose messages name them the
same way.

Mapping: ``max_completion_tokens`` (or ``max_tokens``) -> ``max_output_tokens``; ``messages`` ->
``input`` as ``[{role, content}]`` (text parts joined), which each lane renders with its model's
chat template (``serve.lanes.prompt_ids``); ``prompt`` -> ``input``, a text no template touches;
``temperature``, ``top_p``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``stop``,
``seed``, ``service_tier``, ``metadata``, vLLM's ``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``stop_token_ids``, ``ignore_eos`` and ``chat_template_kwargs`` (chat only) and
fastmode's ``allow_spill`` unchanged (``SAMPLING``); chat's ``logprobs: true`` with ``top_logprobs``
and completions' ``logprobs`` -> ``logprobs`` (the number of top tokens; their log probabilities
come back in each delta, ``serve.openai_api`` shapes them as OpenAI does).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "developer", "user", "assistant")


class OpenAIRequestError(ValueError):
    """A request this API refuses before it reaches the router: HTTP 400, naming ``param``; ``code``
    ``unsupported_parameter`` for a field this server does not implement, else ``invalid_request``."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def unsupported(name: str, why: str) -> OpenAIRequestError:
    return OpenAIRequestError(f"{name}: {why}", name, "unsupported_parameter")


NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "suffix": ("",),
    "tools": ([],), "functions": ([],), "tool_choice": ("none", "auto"), "parallel_tool_calls": (True, False),
    "response_format": ({"type": "text"},), "modalities": (["text"],), "store": (False,),
    "use_beam_search": (False,), "skip_special_tokens": (True,),
    "include_stop_str_in_output": (False,),
    # Responses' own
    "background": (False,), "text": ({"format": {"type": "text"}},),
}
"""Fields this server does not implement, with the values that mean "not used" (``None`` always
does): they are accepted at those values and refused (``unsupported_parameter``) at any other."""

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
            "logit_bias", "stop", "stop_token_ids", "min_tokens", "seed")
"""The sampling fields every OpenAI door passes to the router as they are (``serve.request.GenerateRequest``
validates them and names a bad one)."""

NO_EFFECT = frozenset({"user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"})
"""Fields accepted and not acted on because they do not change the output: end-user identifiers
(for abuse monitoring at OpenAI) and prompt-cache hints (every lane reuses cached prefixes itself)."""


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is ``neutral`` (``True`` is not ``1``, as JSON tells them apart)."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def refuse_unimplemented(fields: dict[str, Any]) -> None:
    """Raise ``unsupported_parameter`` for the first of ``fields`` (a body's fields this API does not
    map) that is neither neutral nor without effect."""
    for name, value in fields.items():
        if value is None or name in NO_EFFECT:
            continue
        if name in NEUTRAL:
            if any(_same(value, v) for v in NEUTRAL[name]):
                continue
            raise unsupported(name, f"not supported by this server (got {value!r:.80})")
        raise unsupported(name, "unknown parameter, not supported by this server")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False


class _Common(BaseModel):
    """The fields both endpoints share; the rest (``model_extra``) go through ``refuse_unimplemented``."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's, as the next three
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Any] | None = None  # vLLM's
    seed: int | None = None
    service_tier: str | None = None
    metadata: dict[str, Any] | None = None
    ignore_eos: bool | None = False  # vLLM's extension (its benchmark client sends it)
    allow_spill: bool | None = False  # fastmode's: serve on standard if priority/exact is full

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def output_budget(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        """Refuse what cannot be honored (an ``OpenAIRequestError`` naming the field)."""
        refuse_unimplemented(self.model_extra or {})

    def generate_request(self, request_id: str) -> dict[str, Any]:
        """The router's request body (``GenerateRequest`` fields), with only the fields that are set."""
        body: dict[str, Any] = {"id": request_id, "model": self.model, "input": self.router_input()}
        optional = {"max_output_tokens": self.output_budget, **{name: getattr(self, name) for name in SAMPLING},
                    "service_tier": self.service_tier, "metadata": self.metadata}
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.allow_spill:
            body["allow_spill"] = True
        return body

    def router_input(self) -> str | list[dict[str, str]]:
        raise NotImplementedError


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise OpenAIRequestError("top_logprobs: needs logprobs: true", "top_logprobs")

    def generate_request(self, request_id: str) -> dict[str, Any]:
        body = super().generate_request(request_id)
        if self.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if self.logprobs:
            body["logprobs"] = self.top_logprobs or 0
        return body

    @property
    def output_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def router_input(self) -> list[dict[str, str]]:
        return [_message(i, m) for i, m in enumerate(self.messages)]


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any = None
    logprobs: int | None = Field(default=None, ge=0, le=20)

    def generate_request(self, request_id: str) -> dict[str, Any]:
        body = super().generate_request(request_id)
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        return body

    def router_input(self) -> str:
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) for p in prompt):
            raise OpenAIRequestError("prompt: token-id prompts are not supported; send the prompt as text",
                                     "prompt")
        if isinstance(prompt, list) and len(prompt) > 1:
            raise OpenAIRequestError(f"prompt: one prompt per request is supported, got {len(prompt)}",
                                     "prompt")
        raise OpenAIRequestError(f"prompt: must be a string, got {type(prompt).__name__}", "prompt")


def _message(i: int, m: dict[str, Any]) -> dict[str, str]:
    """One chat message as the router takes it: ``{role, content}`` with the text parts joined."""
    where = f"messages[{i}]"
    role, content = m.get("role"), m.get("content")
    if role in ("tool", "function"):
        raise OpenAIRequestError(f"{where}.role: tool calling is not supported ({role!r} messages)",
                                 f"{where}.role")
    if role not in ROLES:
        raise OpenAIRequestError(f"{where}.role: must be one of {list(ROLES)}, got {role!r}", f"{where}.role")
    if m.get("tool_calls") or m.get("function_call"):
        raise OpenAIRequestError(f"{where}: tool calls are not supported", f"{where}.tool_calls")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise OpenAIRequestError(f"{where}.content[{j}]: only text parts are supported, got "
                                         f"type {kind!r}", f"{where}.content[{j}].type")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise OpenAIRequestError(f"{where}.content: must be a string or a list of text parts, got "
                                 f"{type(content).__name__}", f"{where}.content")
    return {"role": role, "content": content}


def parse(cls: type[_Common], data: Any) -> _Common:
    """Validate a request body; an ``OpenAIRequestError`` names the first bad field."""
    if not isinstance(data, dict):
        raise OpenAIRequestError(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        req = cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.80})"
        raise OpenAIRequestError(f"{param or '(body)'}: {err['msg']}{got}", param) from None
    req.check()
    return req
