"""One request, timed the same way, through either front door the load generator drives.

- ``websocket_request``: fastmode's persistent WebSocket with the SDK (``clients.sdk.AsyncClient``),
  as fastmode's users connect.
- ``openai_request``: any OpenAI-compatible ``/v1/completions`` (or ``/v1/chat/completions``)
  endpoint, streamed over SSE with ``httpx`` (one pooled ``AsyncClient``, keep-alive, as an OpenAI
  client library connects): fastmode's own HTTP API, vLLM's OpenAI server
  (``python -m vllm.entrypoints.openai.api_server``) and llama.cpp's ``llama-server`` alike.

Two workloads (``WORKLOADS``), the same on every server: ``completion``, the raw ``PROMPT`` as text
to continue (a base model's use), and ``chat``, ``CHAT_PROMPT`` as one user message that the server
renders through the model's chat template (an instruct model's use: what a draft distilled on the
full model's chat answers is trained for). ``workload_for`` picks ``chat`` for a full model with a
chat template.

Both return the same record (``openai_request``'s also ``server_timings`` where the server sends its
own, as llama.cpp's ``llama-server`` does), raise the SDK's ``Overloaded`` on a rejection (WebSocket ``overloaded``
event, HTTP 429 with ``Retry-After``) and another ``FastmodeError`` on any other failure, so
``bench.lanes.run_level`` treats every target alike.

``LLAMA_CPP_GOALS``: the ratios a run is read against llama.cpp's server (``bench.report``).
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

PROMPT = "class Parser:\n"
"""The ``completion`` workload's prompt."""
CHAT_PROMPT = ("Write a Python class Parser that parses arithmetic expressions such as 2 * (3 + 4) - 5, "
               "with a docstring for each method, then explain how it works.")
"""The ``chat`` workload's user message (an answer longer than any request's ``max_tokens``)."""
WORKLOADS = ("chat", "completion")


def workload_for(full_path) -> str:
    """``chat`` when the full model's tokenizer has a chat template (``tokenizer_config.json`` or
    ``chat_template.jinja``), else ``completion``."""
    from pathlib import Path

    folder = Path(full_path)
    if (folder / "chat_template.jinja").is_file():
        return "chat"
    try:
        return "chat" if json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template") else "completion"
    except (OSError, ValueError):
        return "completion"


def prompt_of(workload: str) -> str:
    """The text a workload sends (the user message, for ``chat``)."""
    return CHAT_PROMPT if workload == "chat" else PROMPT


def _record(sent: float, first: float | None, end: float, n: int, chunks: int, *, server_ttft_s: float | None = None,
            server_decode_tokens_per_s: float | None = None, cost_units: float | None = None,
            lane: str | None = None, finish_reason: str | None = None,
            speculative: dict[str, Any] | None = None) -> dict[str, Any]:
    first = first or end
    return {"sent": sent, "first": first, "end": end, "output_tokens": n, "chunks": chunks, "ttft_s": first - sent,
            "decode_tokens_per_s": (n - 1) / (end - first) if n > 1 and end > first else None,
            "e2e_tokens_per_s": n / (end - sent) if end > sent else None,
            "server_ttft_s": server_ttft_s, "server_decode_tokens_per_s": server_decode_tokens_per_s,
            "cost_units": cost_units, "lane": lane, "finish_reason": finish_reason, "speculative": speculative}


async def websocket_request(client, model: str, tier: str | None, tokens: int,
                            workload: str = "completion") -> dict[str, Any]:
    """One greedy ``ignore_eos`` request of ``tokens`` tokens over the SDK's WebSocket (``chat``: the
    input as one user message, which the server templates; ``completion``: a raw input string)."""
    text = [{"role": "user", "content": CHAT_PROMPT}] if workload == "chat" else PROMPT
    sent = time.perf_counter()
    stream = await client.responses.stream(model=model, service_tier=tier, input=text,
                                           max_output_tokens=tokens, temperature=0, ignore_eos=True)
    first, chunks = None, 0
    async for text in stream:
        chunks += bool(text)
        if first is None and text:
            first = time.perf_counter()
    end = time.perf_counter()
    r = stream.result
    return _record(sent, first, end, r.usage.output_tokens if r.usage else 0, chunks,
                   server_ttft_s=r.timing.ttft_s if r.timing else None,
                   server_decode_tokens_per_s=r.timing.decode_tokens_per_s if r.timing else None,
                   cost_units=r.cost_units, lane=r.lane, finish_reason=r.finish_reason, speculative=r.speculative)


def _http_error(status: int, body: bytes, headers) -> Exception:
    from clients.sdk.errors import FastmodeError, Overloaded

    try:
        err = json.loads(body).get("error") or {}
        message = err.get("message", "") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = body[:200].decode(errors="replace")
    if status == 429:
        retry = headers.get("retry-after")
        return Overloaded("overloaded", message, float(retry) if retry else None)
    return FastmodeError(f"http_{status}", message)


async def openai_request(http, model: str, tier: str | None, tokens: int,
                         workload: str = "completion") -> dict[str, Any]:
    """One greedy ``ignore_eos`` streamed completion on ``http`` (an ``httpx.AsyncClient`` whose
    base URL is the server). ``ignore_eos`` is vLLM's extension, which fastmode honours too.

    A transport failure (typically a pooled keep-alive connection the server closed just as it was
    reused, which OpenAI's own client retries) raises ``FastmodeError("transport_error")``: the
    load generator counts it and sends the request again."""
    import httpx

    from clients.sdk.errors import FastmodeError

    try:
        return await _openai_request(http, model, tier, tokens, workload)
    except httpx.TransportError as e:
        raise FastmodeError("transport_error", f"{type(e).__name__}: {e}") from e


async def _openai_request(http, model: str, tier: str | None, tokens: int, workload: str) -> dict[str, Any]:
    from clients.sdk.errors import FastmodeError

    chat = workload == "chat"
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "temperature": 0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                            **({"messages": [{"role": "user", "content": CHAT_PROMPT}]} if chat else {"prompt": PROMPT})}
    if tier:
        body["service_tier"] = tier
    sent = time.perf_counter()
    first, usage, finish, chunks, spec, timings = None, None, None, 0, None, None
    async with http.stream("POST", "/v1/chat/completions" if chat else "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise _http_error(r.status_code, await r.aread(), r.headers)
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise FastmodeError(str(chunk["error"].get("code") or "error"), str(chunk["error"].get("message")))
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                chunks += bool(text)
                if text and first is None:
                    first = time.perf_counter()
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
            spec = (chunk.get("fastmode") or {}).get("speculative") or spec  # the exact lane's drafts
            timings = chunk.get("timings") or timings  # llama-server's own timings (and drafts)
    end = time.perf_counter()
    if not usage:
        raise FastmodeError("no_usage", "the stream ended without a usage chunk")
    record = _record(sent, first, end, int(usage["completion_tokens"]), chunks, finish_reason=finish, speculative=spec)
    if timings:
        record["server_timings"] = timings
    return record


class Goal(NamedTuple):
    """A ratio a run is read against: fastmode's ``lane`` (over ``api``) over another server's ``theirs``
    at ``streams`` streams, on ``figure``, at least ``at_least``."""

    name: str
    lane: str
    api: str
    theirs: str
    streams: int
    figure: str
    at_least: float


FIGURES = {"per_user": ("per-user tok/s", lambda r: r["per_user_e2e_tokens_per_s"]["p50"]),
           "aggregate": ("aggregate tok/s", lambda r: r["aggregate_tokens_per_s"])}
"""A ``Goal``'s figure of a level's record (``bench.lanes.run_level``): per-user speed end to end
(p50; servers chunk their streams differently, so per-chunk decode timing would favour the one that
sends tokens in bursts) or the level's aggregate."""

LLAMA_CPP_GOALS = (
    Goal("fast lane per user, 1 stream", "fast", "websocket", "llama-server-fast", 1, "per_user", 1.5),
    Goal("fast lane aggregate, 32 streams", "fast", "websocket", "llama-server-fast", 32, "aggregate", 2.0),
    Goal("exact tier per user, 1 stream", "exact", "openai", "llama-server-full-spec", 1, "per_user", 1.2),
    Goal("standard lane aggregate, 32 streams", "standard", "openai", "llama-server-full", 32, "aggregate", 1.0),
)
"""fastmode against llama.cpp's ``llama-server`` on the same checkpoints (``bench.llama_cpp_serve``):
the fast lane over the WebSocket against llama-server on the fast model (the front door fastmode's
fast-lane users get); the exact tier against llama-server's speculative decoding with the fast model
drafting, and the standard lane against llama-server on the full model, both through fastmode's
OpenAI API, the API llama-server is driven through."""
