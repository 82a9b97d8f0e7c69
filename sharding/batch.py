"""What crosses the scheduler/executor boundary: one step's batch in, its sampled tokens out.

The scheduler (``sharding.scheduler``) builds a ``StepBatch`` per engine step; a ``StageRunner``
runs it (``LocalExecutor`` in process, or the chips of a ring) and the sampled tokens come back as
a ``StepResult``. Both are plain dataclasses of tensors and lists, so they cross the
ring of chips (``sharding.ring``) as a few raw tensors, and carry nothing per request that is not
needed this step: a request's sampling parameters travel once, in the step that admits it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .config import ModelConfig
from .sampling import Logprobs, SamplingParams

@dataclass
class Rows:
    """One forward's rows: prefill (``S`` = longest prompt) or decode (``S = 1``).

    Row ``b`` holds ``S`` consecutive tokens of the sequence in KV-cache slot ``slots[b]``,
    right-padded (see ``sharding.model``); ``last[b]`` is the index in ``S`` of its last real
    token, whose logits pick the row's next token.
    """

    tokens: torch.Tensor | None
    """``[B, S]`` long token ids; ``None`` once the first stage has embedded them."""
    positions: torch.Tensor
    """``[B, S]`` long, each token's position in its sequence."""
    slots: torch.Tensor
    """``[B]`` long, each row's KV-cache slot."""
    last: torch.Tensor
    """``[B]`` long, index of each row's last real token."""
    context: int
    """The longest row's length once these tokens are in: ``max(positions) + 1``. Attention
    reads no cache position at or beyond it."""

    @property
    def num_rows(self) -> int:
        """``B``."""
        return int(self.slots.shape[0])

    def without_tokens(self) -> Rows:
        """These rows as later stages need them (the token ids stay with the first stage)."""
        return Rows(None, self.positions, self.slots, self.last, self.context)


@dataclass
class StepBatch:
    """Everything an executor needs for one engine step."""

    prefill: Rows | None = None
    """Requests admitted this step, whole prompts."""
    decode: Rows | None = None
    """Requests already running, one token each."""
    admit: dict[int, SamplingParams] = field(default_factory=dict)
    """Slot -> sampling parameters of each request admitted this step: the sampler keeps them (and
    makes a sampled request's generator) until the slot is freed."""
    freed: list[int] = field(default_factory=list)
    """Slots given up since the last step; the sampler forgets their parameters."""
    prompts: dict[int, list[int]] = field(default_factory=dict)
    """Slot -> prompt ids of each request admitted this step (whole, a prefix-cache hit's too): they
    travel with its parameters, once, for the stage with the head (a repetition penalty's
    ``History``, a cut head's ``PromptRows``)."""

    def parts(self) -> list[Rows]:
        """The non-empty row groups in execution order: prefill, then decode."""
        return [r for r in (self.prefill, self.decode) if r is not None]


@dataclass(frozen=True)
class Hop:
    """One transfer of a step's payload from one chip to another.

    ``seconds`` is the receiver's wall clock on entry minus the sender's ``sent_at``
    (``time.time_ns``), never below 0: exact on one node, as good as NTP across nodes. It covers serialisation,
    the channel and any wait of the receiver for its previous work.
    """

    src_chip: str
    dst_chip: str
    src_stage: int
    """Sender's pipeline stage."""
    dst_stage: int
    bytes: int
    """Bytes of the payload's tensors (hidden states between stages, token ids back to the head)."""
    seconds: float
    transport: str
    """``"tcp"`` (``sharding.transport``)."""
    received_at: int = 0
    """``time.time_ns()`` when the receiver got it (so the hop spans ``[received_at - seconds, received_at]``)."""


@dataclass
class StepResult:
    """What an executor answers for one ``StepBatch``."""

    prefill: list[int] = field(default_factory=list)
    """Sampled token per prefill row."""
    decode: list[int] = field(default_factory=list)
    """Sampled token per decode row."""
    logprobs: dict[int, Logprobs] = field(default_factory=dict)
    """Slot -> the sampled token's ``Logprobs``, for the requests that asked for them."""
    hops: list[Hop] = field(default_factory=list)
    """Every hop of this step, in no particular order (empty in process)."""
    stage_seconds: list[float] = field(default_factory=list)
    """Compute seconds per stage (its TP rank 0), from input in hand to output ready."""

    @classmethod
    def of_parts(cls, batch: StepBatch, tokens: list[list[int]], **kw) -> StepResult:
        """A result whose tokens come per part of ``batch`` (``batch.parts()`` order)."""
        it = iter(tokens)
        return cls(prefill=next(it) if batch.prefill is not None else [],
                   decode=next(it) if batch.decode is not None else [], **kw)


class Executor(Protocol):
    """Runs steps on a model, wherever the model lives."""

    config: ModelConfig
    num_slots: int
    max_len: int

    def execute(self, batch: StepBatch) -> StepResult:
        """Run one step: forward every part, sample at the last stage, return the tokens."""
        ...

    def shutdown(self) -> None:
        """Release whatever the executor holds (processes, reservations); idempotent."""
        ...


def payload_bytes(tensors: list[torch.Tensor | None]) -> int:
    """Total bytes of the given tensors (``None`` counts zero)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
