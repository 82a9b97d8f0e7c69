"""``Engine``: single-process continuous batching over one ``Llama`` and its ``KVCache``.

Each ``step()`` admits waiting requests into free cache slots and prefills them (one forward,
rows right-padded to the longest prompt), then decodes one token for every sequence that was
already running (one forward, ``S = 1``). Sequences join and leave between steps; a finished or
aborted sequence frees its slot at once. Under tensor parallelism every rank runs the same
engine on the same requests (SPMD): logits are identical after the head's all-gather and each
request's generator is seeded alike, so the ranks pick the same tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import DuplicateRequest, EmptyPrompt, InvalidLayout, PromptTooLong, TokenOutOfRange
from .kv_cache import KVCache
from .model import Llama
from .sampling import SamplingParams, make_generator, sample
from .weights import load_model


@dataclass(frozen=True)
class StepOutput:
    """What one sequence produced in one ``step()``."""

    request_id: str
    token_ids: list[int]
    """Tokens generated this step (one, today)."""
    finished: bool
    finish_reason: str | None = None
    """``"stop"`` (a stop or eos token, which is included), ``"length"`` (``max_tokens``), or ``None``."""


@dataclass
class _Sequence:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)
    slot: int = -1

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)


class Engine:
    """Continuous-batching generation on one model (whole, or one TP rank of it).

    Args:
        model: a loaded ``Llama`` with both the embedding and the head (no pipeline stage).
        num_slots: sequences decoded at once; more requests wait in FIFO order.
        max_len: tokens per sequence (prompt + generated); default and cap: the model's context.
    """

    def __init__(self, model: Llama, *, num_slots: int = 8, max_len: int | None = None) -> None:
        if not (model.has_embedding and model.has_head):
            raise InvalidLayout("Engine needs a whole model (embedding and head); got a pipeline stage")
        self.model = model
        self.config = model.config
        self.cache = KVCache.for_model(model, num_slots=num_slots, max_len=max_len)
        self.max_len = self.cache.max_len
        self.device = next(model.parameters()).device
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}

    @classmethod
    def from_pretrained(cls, path: str | Path, *, num_slots: int = 8, max_len: int | None = None,
                        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Engine:
        """An engine over the checkpoint at ``path`` (single process, no parallelism)."""
        return cls(load_model(path, dtype=dtype, device=device), num_slots=num_slots, max_len=max_len)

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._waiting or self._running)

    def add(self, request_id: str, prompt_ids: Seq[int], params: SamplingParams | None = None) -> None:
        """Queue a request; it is prefilled by the first ``step()`` that finds a free slot.

        Raises ``EmptyPrompt``, ``TokenOutOfRange``, ``PromptTooLong`` (prompt + ``max_tokens``
        beyond ``max_len``) or ``DuplicateRequest``, before anything is queued.
        """
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EmptyPrompt(f"request {request_id!r} has an empty prompt")
        bad = [t for t in prompt if not 0 <= t < self.config.vocab_size]
        if bad:
            raise TokenOutOfRange(f"request {request_id!r} has token ids {bad[:5]} outside the "
                                  f"vocabulary [0, {self.config.vocab_size})")
        if len(prompt) + params.max_tokens > self.max_len:
            raise PromptTooLong(f"request {request_id!r}: prompt of {len(prompt)} tokens + max_tokens "
                                f"{params.max_tokens} exceeds the context of {self.max_len} tokens")
        if request_id in self._running or any(s.request_id == request_id for s in self._waiting):
            raise DuplicateRequest(f"request {request_id!r} is already in the engine")
        self._waiting.append(_Sequence(request_id, prompt, params, make_generator(params, self.device)))

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its slot; ``False`` if it is unknown."""
        if request_id in self._running:
            self.cache.free(self._running.pop(request_id).slot)
            return True
        for seq in self._waiting:
            if seq.request_id == request_id:
                self._waiting.remove(seq)
                return True
        return False

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Prefill newly admitted requests and decode one token for each running one."""
        decoding = list(self._running.values())
        admitted = []
        while self._waiting and self.cache.num_free:
            seq = self._waiting.popleft()
            seq.slot = self.cache.allocate()
            self._running[seq.request_id] = seq
            admitted.append(seq)
        outputs = []
        if admitted:
            outputs += self._emit(admitted, self._prefill(admitted))
        if decoding:
            outputs += self._emit(decoding, self._decode(decoding))
        return outputs

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[int]]:
        """Generate for every prompt (continuously batched) and return the new tokens of each.

        For offline use on an idle engine: it drives ``step()`` itself, so it refuses to run while
        requests added with ``add`` are in flight (their outputs would be swallowed).
        """
        if self.has_work:
            raise RuntimeError("generate() needs an idle engine; drive add()/step() instead")
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        ids = [f"generate-{id(self)}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params_list, strict=True):
            self.add(rid, prompt, p)
        out: dict[str, list[int]] = {rid: [] for rid in ids}
        pending = set(ids)
        while pending:
            for o in self.step():
                if o.request_id in out:
                    out[o.request_id] += o.token_ids
                    if o.finished:
                        pending.discard(o.request_id)
        return [out[rid] for rid in ids]

    def _prefill(self, seqs: list[_Sequence]) -> torch.Tensor:
        lens = [len(s.prompt) for s in seqs]
        width = max(lens)
        # Right-pad with token 0 at continuing positions (see sharding.model on why that is safe).
        tokens = torch.tensor([s.prompt + [0] * (width - len(s.prompt)) for s in seqs], device=self.device)
        positions = torch.arange(width, device=self.device).expand(len(seqs), width)
        hidden = self._forward(seqs, tokens, positions)  # [B, width, D]
        last = hidden[torch.arange(len(seqs), device=self.device),
                      torch.tensor(lens, device=self.device) - 1]  # [B, D]
        return self._sample(seqs, self.model.compute_logits(last))

    def _decode(self, seqs: list[_Sequence]) -> torch.Tensor:
        tokens = torch.tensor([[s.output[-1]] for s in seqs], device=self.device)  # [B, 1]
        positions = torch.tensor([[s.length - 1] for s in seqs], device=self.device)
        hidden = self._forward(seqs, tokens, positions)  # [B, 1, D]
        return self._sample(seqs, self.model.compute_logits(hidden[:, 0]))

    def _forward(self, seqs: list[_Sequence], tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        return self.model(tokens, positions, slots, self.cache)

    def _sample(self, seqs: list[_Sequence], logits: torch.Tensor) -> torch.Tensor:
        return sample(logits, [s.params for s in seqs], [s.generator for s in seqs])

    def _emit(self, seqs: list[_Sequence], tokens: torch.Tensor) -> list[StepOutput]:
        outputs = []
        for seq, token in zip(seqs, tokens.tolist(), strict=True):
            seq.output.append(token)
            p = seq.params
            reason = None
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.config.eos_token_ids):
                reason = "stop"
            elif len(seq.output) >= p.max_tokens:
                reason = "length"
            if reason is not None:
                self.cache.free(self._running.pop(seq.request_id).slot)
            outputs.append(StepOutput(seq.request_id, [token], reason is not None, reason))
        return outputs
