"""``Scheduler``: the engine's request bookkeeping, wherever the model runs.

Requests wait in FIFO order until a KV-cache slot is free. Each step admits as many as there are
free slots and prefills them (rows right-padded to the longest prompt), and decodes one token for
every sequence that was already running (``S = 1``). Sequences join and leave between steps; a
finished or aborted sequence frees its slot at once, and the executor hears of it (to drop the
slot's sampling generator) with the next batch.

With ``prefix_cache`` on, a finished or aborted sequence's slot is parked instead of freed
(``sharding.prefix_cache``): a later prompt that starts with its tokens takes the slot over and
prefills only the tokens after the shared prefix, at their own positions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from .batch import Rows, StepBatch, StepResult
from .config import ModelConfig
from .errors import DuplicateRequest, EmptyPrompt, PromptTooLong, TokenOutOfRange
from .kv_cache import SlotPool
from .prefix_cache import PrefixCache, place, release
from .sampling import Logprobs, SamplingParams


@dataclass(frozen=True)
class StepOutput:
    """What one sequence produced in one ``step()``."""

    request_id: str
    token_ids: list[int]
    """Tokens generated this step (one, today)."""
    finished: bool
    finish_reason: str | None = None
    """``"stop"`` (a stop or eos token, which is included), ``"length"`` (``max_tokens``), or ``None``."""
    cached: int | None = None
    """On the request's first output (its prefill): prompt tokens its slot already held (prefix cache)."""
    logprobs: list[Logprobs] | None = None
    """One ``Logprobs`` per token of ``token_ids``, when the request asked for them."""


@dataclass
class _Sequence:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    slot: int = -1
    cached: int = 0
    """Prompt tokens whose keys and values the slot already held (a prefix-cache hit)."""

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)


class Scheduler:
    """Waiting and running requests, their slots, and the batch of each step.

    Args:
        config: the model's shape (vocabulary and eos ids).
        slots: the pool the sequences' KV-cache slots come from.
        max_len: tokens per sequence (prompt + generated).
        prefix_cache: park the slots of finished sequences for prompts that continue them.
    """

    def __init__(self, config: ModelConfig, slots: SlotPool, max_len: int, prefix_cache: bool = False) -> None:
        self.config, self.slots, self.max_len = config, slots, max_len
        self.prefix: PrefixCache | None = PrefixCache() if prefix_cache else None
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._freed: list[int] = []
        # The sequences of the batch in flight, in row order: (prefill, decode).
        self._in_flight: tuple[list[_Sequence], list[_Sequence]] = ([], [])

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._waiting or self._running)

    @property
    def num_unfinished(self) -> int:
        """Requests waiting or running (an aborted one is gone at once)."""
        return len(self._waiting) + len(self._running)

    def validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Raise the typed error a request would get from ``add``, without queueing it."""
        validate_request(self.config, self.max_len, request_id, prompt, params)

    def add(self, request_id: str, prompt_ids: Seq[int], params: SamplingParams | None = None) -> None:
        """Queue a request (see ``Engine.add`` for the errors it raises)."""
        params = params or SamplingParams(temperature=0)
        prompt = [int(t) for t in prompt_ids]
        self.validate(request_id, prompt, params)
        if request_id in self._running or any(s.request_id == request_id for s in self._waiting):
            raise DuplicateRequest(f"request {request_id!r} is already in the engine")
        self._waiting.append(_Sequence(request_id, prompt, params))

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its slot; ``False`` if it is unknown."""
        if request_id in self._running:
            self._release(self._running.pop(request_id))
            return True
        for seq in self._waiting:
            if seq.request_id == request_id:
                self._waiting.remove(seq)
                return True
        return False

    def schedule(self) -> StepBatch | None:
        """Admit waiting requests into free slots and build this step's batch (``None``: no work)."""
        decoding = list(self._running.values())
        admitted = []
        while self._waiting and (self.slots.num_free or self.prefix):
            seq = self._waiting.popleft()
            self._place(seq)
            self._running[seq.request_id] = seq
            admitted.append(seq)
        if not (admitted or decoding):
            return None
        self._in_flight = (admitted, decoding)
        batch = StepBatch(prefill=prefill_rows(admitted, self.max_len) if admitted else None,
                          decode=decode_rows(decoding) if decoding else None,
                          admit={s.slot: s.params for s in admitted}, freed=self._freed,
                          prompts={s.slot: s.prompt for s in admitted})
        self._freed = []
        return batch

    def postprocess(self, result: StepResult) -> list[StepOutput]:
        """Append the step's tokens, finish sequences that stopped, and report every row."""
        admitted, decoding = self._in_flight
        self._in_flight = ([], [])
        return (self._emit(admitted, result.prefill, result.logprobs, prefill=True)
                + self._emit(decoding, result.decode, result.logprobs))

    def _emit(self, seqs: list[_Sequence], tokens: list[int], logprobs: dict[int, Logprobs],
              prefill: bool = False) -> list[StepOutput]:
        outputs = []
        for seq, token in zip(seqs, tokens, strict=True):
            seq.output.append(token)
            p = seq.params
            reason = None
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.config.eos_token_ids):
                reason = "stop"
            elif len(seq.output) >= p.max_tokens:
                reason = "length"
            if reason is not None:
                self._release(self._running.pop(seq.request_id))
            lp = logprobs.get(seq.slot)
            outputs.append(StepOutput(seq.request_id, [token], reason is not None, reason,
                                      seq.cached if prefill else None, None if lp is None else [lp]))
        return outputs

    def clear_prefix(self) -> None:
        """Free every parked slot (their contents are about to be overwritten out of band)."""
        while self.prefix:
            self.slots.free(self.prefix.evict())

    def _place(self, seq: _Sequence) -> None:
        """Give ``seq`` a slot (``prefix_cache.place``)."""
        seq.slot, seq.cached = place(self.prefix, self.slots, seq.prompt)

    def _release(self, seq: _Sequence) -> None:
        # Every token fed so far has its keys and values in the slot: all but the last output.
        release(self.prefix, self.slots, seq.slot, seq.prompt + seq.output[:-1])
        self._freed.append(seq.slot)

    def reserve(self, prompt_ids: Seq[int]) -> int:
        """Debug: a slot for a one-off forward of ``prompt_ids`` outside the step loop
        (``CacheFull`` if none is free). It goes straight back to the pool: what the forward
        leaves in the cache is overwritten before any later sequence reads it.
        """
        prompt = [int(t) for t in prompt_ids]
        self.validate("prompt_logits", prompt, SamplingParams(temperature=0, max_tokens=1))
        if self.prefix is not None and not self.slots.num_free and len(self.prefix):
            self.slots.free(self.prefix.evict())  # its contents are about to be overwritten
        slot = self.slots.allocate()
        self.slots.free(slot)
        return slot


def validate_request(config: ModelConfig, max_len: int, request_id: str, prompt: list[int],
                     params: SamplingParams) -> None:
    """The one check of a request against a model: raises ``EmptyPrompt``, ``TokenOutOfRange`` (in the
    prompt or ``logit_bias``) or
    ``PromptTooLong`` (prompt + ``max_tokens`` beyond ``max_len``)."""
    if not prompt:
        raise EmptyPrompt(f"request {request_id!r} has an empty prompt")
    bad = [t for t in prompt if not 0 <= t < config.vocab_size]
    if bad:
        raise TokenOutOfRange(f"request {request_id!r} has token ids {bad[:5]} outside the "
                              f"vocabulary [0, {config.vocab_size})")
    bad = [t for t, _ in params.logit_bias if t >= config.vocab_size]
    if bad:
        raise TokenOutOfRange(f"request {request_id!r}: logit_bias has token ids {bad[:5]} outside the "
                              f"vocabulary [0, {config.vocab_size})")
    if len(prompt) + params.max_tokens > max_len:
        raise PromptTooLong(f"request {request_id!r}: prompt of {len(prompt)} tokens + max_tokens "
                            f"{params.max_tokens} exceeds the context of {max_len} tokens")


def prefill_rows(seqs: list[_Sequence], max_len: int, cached: list[int] | None = None) -> Rows:
    """Each prompt past its cached prefix (all of it without one), at its own positions,
    right-padded with token 0 (see ``sharding.model`` on why that is safe). A padding position
    past the context is clamped to its last position: the row's own, overwritten before read.
    ``cached``: per sequence, the prefix to skip (default: each one's ``cached``)."""
    cached = [s.cached for s in seqs] if cached is None else cached
    new = [s.prompt[c:] for s, c in zip(seqs, cached)]
    width = max(len(n) for n in new)
    tokens = torch.tensor([n + [0] * (width - len(n)) for n in new])  # [B, width]
    starts = torch.tensor(cached)
    positions = (starts[:, None] + torch.arange(width)).clamp_(max=max_len - 1)
    return Rows(tokens=tokens, positions=positions, slots=torch.tensor([s.slot for s in seqs]),
                last=torch.tensor([len(n) for n in new]) - 1, context=max(len(s.prompt) for s in seqs))


def decode_rows(seqs: list[_Sequence]) -> Rows:
    """The last token of each running sequence, at its position: ``[B, 1]``."""
    lengths = [s.length for s in seqs]
    # One small tensor per step (this runs for every generated token), each row of it a
    # contiguous view, so a compiled model sees the same strides every step.
    rows = torch.tensor([[s.output[-1] for s in seqs], [n - 1 for n in lengths],
                         [s.slot for s in seqs], [0] * len(seqs)])  # [4, B]
    B = len(seqs)
    return Rows(tokens=rows[0].view(B, 1), positions=rows[1].view(B, 1), slots=rows[2], last=rows[3],
                context=max(lengths))
