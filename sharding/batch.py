"""What crosses the scheduler/executor boundary: one step's batch in, its sampled tokens out.

The scheduler (``sharding.scheduler``) builds a ``StepBatch`` per engine step; an executor
(``LocalExecutor`` in process, ``PipelineExecutor`` across chip actors) runs it and answers a
``StepResult``. Both are plain dataclasses of tensors and lists, so they pickle cheaply into a Ray
compiled graph's channels, and carry nothing per request that is not needed this step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .config import ModelConfig
from .sampling import SamplingParams

DRIVER = "driver"
"""The chip id of the process that drives the engine (source of a step, sink of its tokens)."""
DRIVER_STAGE = -1
"""The stage index of the driver in ``Hop`` records."""


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
    params: list[SamplingParams]
    """Each row's sampling parameters."""
    context: int
    """The longest row's length once these tokens are in: ``max(positions) + 1``. Attention
    reads no cache position at or beyond it."""

    @property
    def num_rows(self) -> int:
        """``B``."""
        return int(self.slots.shape[0])

    def without_tokens(self) -> Rows:
        """These rows as later stages need them (the token ids stay with the first stage)."""
        return Rows(None, self.positions, self.slots, self.last, self.params, self.context)


@dataclass
class StepBatch:
    """Everything an executor needs for one engine step."""

    prefill: Rows | None = None
    """Requests admitted this step, whole prompts."""
    decode: Rows | None = None
    """Requests already running, one token each."""
    seeds: dict[int, int | None] = field(default_factory=dict)
    """Slot -> seed of each newly admitted *sampled* request: its generator is (re)made before
    sampling (``None``: a fresh random seed). Greedy requests need no generator."""
    freed: list[int] = field(default_factory=list)
    """Slots given up since the last step; the executor drops their generators."""
    return_logits: bool = False
    """Debug: also return the logits of every position (``StepResult.logits``)."""
    sent_at: int = 0
    """``time.time_ns()`` when the driver sent the batch (for the driver -> first stage hop)."""

    def parts(self) -> list[Rows]:
        """The non-empty row groups in execution order: prefill, then decode."""
        return [r for r in (self.prefill, self.decode) if r is not None]


@dataclass(frozen=True)
class Hop:
    """One transfer of a step's payload from one chip to another (or to/from the driver).

    ``seconds`` is the receiver's wall clock on entry minus the sender's ``sent_at``
    (``time.time_ns``): exact on one node, as good as NTP across nodes. It covers serialisation,
    the channel and any wait of the receiver for its previous work.
    """

    src_chip: str
    dst_chip: str
    src_stage: int
    """Sender's pipeline stage (``DRIVER_STAGE`` for the driver)."""
    dst_stage: int
    bytes: int
    """Bytes of the payload's tensors (hidden states between stages, token ids from the driver)."""
    seconds: float
    transport: str
    """``"compiled_graph"`` or ``"actor_calls"`` (``"local"`` for the in-process executor)."""
    received_at: int = 0
    """``time.time_ns()`` when the receiver got it (so the hop spans ``[received_at - seconds, received_at]``)."""


@dataclass
class StepResult:
    """What an executor answers for one ``StepBatch``."""

    prefill: list[int] = field(default_factory=list)
    """Sampled token per prefill row."""
    decode: list[int] = field(default_factory=list)
    """Sampled token per decode row."""
    hops: list[Hop] = field(default_factory=list)
    """Every hop of this step, in no particular order."""
    stage_seconds: list[float] = field(default_factory=list)
    """Compute seconds per stage (its TP rank 0), from input in hand to output ready."""
    logits: list[torch.Tensor] | None = None
    """With ``StepBatch.return_logits``: ``[B, S, V]`` per part."""
    sent_at: int = 0
    """``time.time_ns()`` when the last stage sent the result (for the return hop)."""

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
