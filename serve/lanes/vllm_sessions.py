"""``Sessions``: a conversation's sequence kept in vLLM between its turns (vLLM's streaming input).

Why: vLLM's prefix cache keeps whole KV-cache blocks only (32 tokens on CPU, where its attention
takes no smaller block), so every turn of a conversation sent as a new request prefills the
history's last partial block again, up to 31 tokens: on a CPU, a large part of a short turn's
first token (docs/multi-turn.md).

vLLM's streaming input (``AsyncLLM.generate`` given an async generator of ``StreamingInput``: a
"resumable" request) keeps a request's sequence and its keys and values after a chunk's output
ends, and appends the next chunk of input to it. Every computed token is reused, the partial block
included. When a chunk's output ends, vLLM drops the last sampled token (it was never fed to the
model) and computes it again at the front of the next chunk.

How fastmode uses it: a request whose prompt continues an earlier prompt (``continues``: the lane's
``PromptIds`` found it extends one it kept, so it is a conversation's next turn, whether sent with
``previous_response_id`` or re-sent whole) runs as a turn of a session. A conversation's first
turn is a plain request, its second opens a session (from the prefix cache), and from the third on
each turn continues it. When a turn's output ends (a stop token or ``max_tokens``), the session is
*parked* with its computed tokens: the turn's prompt and its output but the last token.
Requests that continue nothing (one-off prompts, a load of one fixed prompt) never park anything. A later request whose prompt ids begin with a
parked session's tokens and go on past them (the conversation's next turn, joined as a full
re-send would join it: ``serve.request.join_messages``, ``PromptIds``) continues that session with
the rest of its prompt. Anything else opens a new session; what it shares with a closed one still
comes from vLLM's prefix cache.

Limits, each a rule here:
- A parked session holds one of vLLM's ``max_num_seqs`` running slots and its KV blocks. Before any
  request is added, the oldest parked sessions are closed until it finds a slot; the parked sessions
  hold at most ``PARKED_KV_SHARE`` of the KV cache (the longest parked close first); a session
  parked ``idle_s`` closes by itself. Closing aborts vLLM's request (its full blocks stay in the prefix
  cache).
- Only requests vLLM's streaming input takes and that continue exactly as a re-send would: no stop
  strings (vLLM refuses them there), and greedy or unseeded (a seeded sampler would go on from its
  state instead of starting again from the seed). Others run as plain requests.
- A turn its caller abandons (cancel, disconnect) aborts its session.

The text of a session's turn is decoded here (``TextStream`` primed with the turn's prompt, as
vLLM's detokenizer is for a new request; vLLM's own would go on from the last turn's output, not
from the new prompt), and vLLM's is turned off for sessions (``detokenize=False``): one decode a
token, not two.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from .engine import EngineRequest
from .detokenizer import TextStream


PARKED_KV_SHARE = 0.25
"""The most of vLLM's KV cache the parked sessions hold together. Parking past it closes the
longest-parked first: vLLM makes room for a running request by preempting running ones, never a
waiting session, so parked blocks past a share would crowd out the requests being served."""


def eligible(request: EngineRequest) -> bool:
    """Whether ``request`` runs as a session's turn: a conversation's turn (``continues``), without
    stop strings, greedy or unseeded."""
    return request.continues and not request.stop and (request.temperature == 0 or request.seed is None)


@dataclass(eq=False)
class _Session:
    key: int
    inputs: asyncio.Queue
    """``StreamingInput`` chunks for vLLM, ``None`` to end the input stream."""
    outputs: Any = None
    """``AsyncLLM.generate`` over ``inputs``: every turn's ``RequestOutput``s, in order."""
    tokens: list[int] = field(default_factory=list)
    """The sequence vLLM has computed (the last turn's prompt and its output but the last token)."""
    timer: asyncio.TimerHandle | None = None


class Sessions:
    """Sessions on one ``AsyncLLM``.

    Args:
        engine: vLLM's ``AsyncLLM``.
        tokenizer: the model's tokenizer (the turns' text).
        slots: vLLM's ``max_num_seqs`` (parked sessions count against it).
        idle_s: how long a session stays parked at most.
    """

    def __init__(self, engine: Any, tokenizer: Tokenizer, slots: int, idle_s: float,
                 kv_tokens: int | None = None) -> None:
        self.engine, self.tokenizer, self.slots, self.idle_s = engine, tokenizer, slots, idle_s
        self.parked: OrderedDict[int, _Session] = OrderedDict()
        """Parked sessions, the longest parked first."""
        self.budget = int(PARKED_KV_SHARE * kv_tokens) if kv_tokens else None
        """Tokens the parked sessions may hold together (``PARKED_KV_SHARE`` of ``kv_tokens``, vLLM's
        KV cache in tokens; ``None``: no bound but the slots)."""
        self.parked_tokens = 0
        self._keys = itertools.count()
        self.continued = 0
        """Turns that continued a parked session (since start)."""
        self.reused_tokens = 0
        """Prompt tokens those turns did not send to vLLM again (since start)."""

    def _unpark(self, key: int) -> _Session:
        s = self.parked.pop(key)
        self.parked_tokens -= len(s.tokens)
        if s.timer is not None:
            s.timer.cancel()
        return s

    def _take(self, prompt_ids: list[int]) -> _Session | None:
        """The parked session ``prompt_ids`` continues (taken out of ``parked``), if any."""
        for key, s in self.parked.items():
            n = len(s.tokens)
            if n < len(prompt_ids) and prompt_ids[:n] == s.tokens:
                return self._unpark(key)
        return None

    def _unpark_oldest(self) -> _Session:
        return self._unpark(next(iter(self.parked)))

    async def make_room(self) -> None:
        """Close the longest parked sessions until vLLM has a free slot (before adding any request)."""
        while self.parked and self.engine.get_num_unfinished_requests() >= self.slots:
            await self._close(self._unpark_oldest())

    @staticmethod
    async def _close(s: _Session) -> None:
        if s.outputs is not None:
            with contextlib.suppress(Exception):
                await s.outputs.aclose()  # AsyncLLM.generate aborts the request

    def _park(self, s: _Session) -> None:
        loop = asyncio.get_running_loop()
        self.parked[s.key] = s
        self.parked_tokens += len(s.tokens)
        s.timer = loop.call_later(self.idle_s, self._expire, s)
        while self.budget is not None and self.parked_tokens > self.budget:  # the longest parked go first
            loop.create_task(self._close(self._unpark_oldest()))

    def _expire(self, s: _Session) -> None:
        if self.parked.get(s.key) is s:
            asyncio.get_running_loop().create_task(self._close(self._unpark(s.key)))

    def stats(self) -> dict[str, int]:
        return {"parked": len(self.parked), "parked_tokens": self.parked_tokens, "continued": self.continued,
                "reused_tokens": self.reused_tokens}

    async def close_all(self) -> None:
        while self.parked:
            await self._close(self._unpark_oldest())

    async def turn(self, request: EngineRequest, params: Any) -> AsyncIterator[tuple[Any, str, int]]:
        """Run ``request`` as a session's turn: ``(RequestOutput, new text, prompt tokens reused)``
        per output, the last one with its ``finish_reason`` set. A new session makes room first.
        ``params``: vLLM's ``SamplingParams`` (changed: its text is decoded here)."""
        from vllm import TokensPrompt
        from vllm.engine.protocol import StreamingInput

        params.detokenize = False
        ids = request.prompt_ids
        s = self._take(ids)
        reused = len(s.tokens) if s is not None else 0
        if s is None:
            await self.make_room()
            s = _Session(next(self._keys), asyncio.Queue())

            async def inputs(q: asyncio.Queue = s.inputs):
                while (chunk := await q.get()) is not None:
                    yield chunk

            s.outputs = self.engine.generate(inputs(), params, f"{request.request_id}-session")
        else:
            self.continued += 1
            self.reused_tokens += reused
        s.inputs.put_nowait(StreamingInput(TokensPrompt(prompt_token_ids=ids[reused:]), params))
        decoder = TextStream(self.tokenizer, prompt_ids=ids)
        out_ids: list[int] = []
        parked = False
        try:
            while True:
                out = await anext(s.outputs)
                c = out.outputs[0]
                out_ids += c.token_ids
                text = decoder.push(c.token_ids, stop_token=c.finish_reason == "stop")  # as vLLM's own text
                if c.finish_reason is not None:
                    s.tokens = ids + out_ids[:-1]
                    self._park(s)  # before the last yield: a caller may stop reading at the end
                    parked = True
                    yield out, text, reused
                    return
                yield out, text, reused
        finally:
            if not parked:
                await self._close(s)
