"""The OpenAI API's request bodies (``/v1/chat/completions``, ``/v1/completions``) and their
translation into the router's ``GenerateRequest`` fields (``serve.request``).

Unknown fields are ignored: OpenAI's clients send many optional ones. Fields whose meaning this
server cannot honor (``n`` other than 1, log probabilities, tools, a non-text ``response_format``,
``echo``, ``suffix``, ``best_of``, non-text message parts, token-id prompts) are refused with a 400
that names the field, rather than answered with something else. The sampling fields are passed on
unchanged and validated by the router, whose messages name them the same way.

Mapping: ``max_completion_tokens`` (or ``max_tokens``) -> ``max_output_tokens``; ``messages`` ->
``input`` as ``[{role, content}]`` (text parts joined); ``prompt`` -> ``input``; ``temperature``,
``top_p``, ``stop``, ``seed``, ``service_tier``, ``metadata``, vLLM's ``ignore_eos`` and fastmode's
``allow_spill`` unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "developer", "user", "assistant")


class OpenAIRequestError(ValueError):
    """A request this API refuses before it reaches the router: HTTP 400, naming ``param``."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False


class _Common(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    service_tier: str | None = None
    metadata: dict[str, Any] | None = None
    ignore_eos: bool | None = False  # vLLM's extension (its benchmark client sends it)
    allow_spill: bool | None = False  # fastmode's: serve on standard if priority/exact is full
    n: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def output_budget(self) -> int | None:
        return self.max_tokens

    def check(self) -> None:
        """Refuse what cannot be honored (an ``OpenAIRequestError`` naming the field)."""
        if self.n not in (None, 1):
            raise OpenAIRequestError(f"n: only one choice per request is supported, got n={self.n}", "n")

    def generate_request(self, request_id: str) -> dict[str, Any]:
        """The router's request body (``GenerateRequest`` fields), with only the fields that are set."""
        body: dict[str, Any] = {"id": request_id, "model": self.model, "input": self.router_input()}
        optional = {"max_output_tokens": self.output_budget, "temperature": self.temperature,
                    "top_p": self.top_p, "stop": self.stop, "seed": self.seed,
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
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def output_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        super().check()
        if self.logprobs or self.top_logprobs:
            raise OpenAIRequestError("logprobs: log probabilities are not supported",
                                     "logprobs" if self.logprobs else "top_logprobs")
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise OpenAIRequestError(f"{name}: tool calling is not supported", name)
        if self.tool_choice not in (None, "none", "auto"):
            raise OpenAIRequestError("tool_choice: tool calling is not supported", "tool_choice")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise OpenAIRequestError(f"response_format: only {{'type': 'text'}} is supported, got "
                                     f"{self.response_format.get('type')!r}", "response_format")

    def router_input(self) -> list[dict[str, str]]:
        return [_message(i, m) for i, m in enumerate(self.messages)]


class CompletionRequest(_Common):
    """``POST /v1/completions``."""

    prompt: Any = None
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    def check(self) -> None:
        super().check()
        if self.logprobs is not None:
            raise OpenAIRequestError("logprobs: log probabilities are not supported", "logprobs")
        if self.echo:
            raise OpenAIRequestError("echo: echoing the prompt is not supported", "echo")
        if self.suffix:
            raise OpenAIRequestError("suffix: insertion (a suffix) is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise OpenAIRequestError(f"best_of: only 1 is supported, got {self.best_of}", "best_of")

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
