"""``Engine``: continuous-batching generation, a ``Scheduler`` in front of an executor.

The scheduler (``sharding.scheduler``) decides what each step computes and turns sampled tokens
into ``StepOutput``s; the executor runs the step wherever the model lives: ``LocalExecutor`` in
this process. (Across chips the loop itself runs on the chips: ``sharding.ring``.) Under in-process tensor
parallelism every rank runs the same engine on the same requests (SPMD): logits are identical
after the head's all-gather and each request's generator is seeded alike, so the ranks pick the
same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from pathlib import Path

import torch

from .batch import Executor, Hop, StepBatch, StepResult
from .errors import InvalidLayout
from .kv_cache import KVCache, SlotPool
from .model import Llama
from .sampling import SamplingParams, params_per_prompt
from .scheduler import Scheduler, StepOutput
from .stage import StageRunner
from .weights import load_model

__all__ = ["Engine", "LocalExecutor", "StepOutput"]


class LocalExecutor:
    """Runs steps on a whole model in this process; the sampling generators live here too.

    Args:
        model: a loaded ``Llama`` with both the embedding and the head (no pipeline stage).
        num_slots: KV-cache slots (sequences decoded at once).
        max_len, kv_cache_bytes: tokens per sequence and the cache's budget (``KVCache.for_model``:
            default the context, at most ``DEFAULT_MAX_LEN``, at most what the budget holds).
        compile: run the model under ``torch.compile`` (``sharding.stage.compile_forward``).
        packed_weights: bfloat16-packed weights for small steps (``sharding.packed``).
        vocab: the only token ids the model may produce (``StageRunner``'s ``vocab``); ``None``: all.
        keep_prompt: with ``vocab``, each request may also produce its prompt's tokens (``StageRunner``'s).
    """

    def __init__(self, model: Llama, *, num_slots: int = 8, max_len: int | None = None,
                 compile: bool = False, packed_weights: bool = False, kv_cache_bytes: int | None = None,
                 vocab: Seq[int] | None = None, keep_prompt: bool = False) -> None:
        if not (model.has_embedding and model.has_head):
            raise InvalidLayout("Engine needs a whole model (embedding and head); got a pipeline stage")
        self.config = model.config
        self.runner = StageRunner(model, num_slots=num_slots, max_len=max_len, compile=compile,
                                  packed_weights=packed_weights, kv_cache_bytes=kv_cache_bytes, vocab=vocab,
                                  keep_prompt=keep_prompt)
        self.cache: KVCache = self.runner.cache
        self.num_slots, self.max_len = num_slots, self.cache.max_len

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> StepResult:
        """Forward every part, sample each row's next token (no hops: nothing travels)."""
        parts = batch.parts()
        self.runner.admit(batch)  # first: a cut head's prompt rows (keep_prompt) come with it
        logits = self.runner.logits(parts)
        tokens, logprobs = self.runner.sample(parts, logits)
        return StepResult.of_parts(batch, tokens, logprobs=logprobs)

    @torch.inference_mode()
    def prompt_logits(self, prompt_ids: list[int], slot: int) -> torch.Tensor:
        """Debug: the logits ``[S, V]`` of every position of ``prompt_ids``, prefilled in ``slot``."""
        return self.runner.prompt_logits(torch.tensor(prompt_ids), slot)

    def shutdown(self) -> None:
        """Nothing to release in process."""


class Engine:
    """Continuous-batching generation over an executor.

    ``Engine(model)`` runs a whole model in this process (a ``LocalExecutor``);
    ``Engine(executor=...)`` runs any other executor with ``execute``/``prompt_logits``. (A model
    sharded over chips runs its own loop instead: ``sharding.pipeline.ShardedModel``.)

    Args:
        model: a loaded ``Llama`` with both the embedding and the head (no pipeline stage).
        num_slots: sequences decoded at once; more requests wait in FIFO order.
        max_len, kv_cache_bytes: tokens per sequence (prompt + generated) and the KV cache's budget
            (``sharding.kv_cache.fit_max_len``: default the context, at most ``DEFAULT_MAX_LEN``).
        compile: with ``model``: run it under ``torch.compile`` (``sharding.stage.compile_forward``).
            Decoding is about twice as fast on CPU once warm; each new kind of step (the first
            prefill, the first decode, the first change of shape) compiles first, for seconds.
        executor: instead of ``model``: the executor to drive (it fixes ``num_slots``/``max_len``).
        prefix_cache: park finished sequences' slots for prompts that continue them
            (``sharding.prefix_cache``).
        packed_weights: with ``model``: decode from bfloat16-packed weights (``sharding.packed``):
            the same tokens, about 3x faster on the full model on this CPU.
        vocab: with ``model``: the only token ids it may produce, ascending (its head keeps their
            rows alone: ``sharding.stage.StageRunner``); ``None``: the whole vocabulary.
        keep_prompt: with ``vocab``, each request may also produce its own prompt's tokens.
    """

    def __init__(self, model: Llama | None = None, *, num_slots: int = 8, max_len: int | None = None,
                 compile: bool = False, executor: Executor | None = None, prefix_cache: bool = False,
                 packed_weights: bool = False, kv_cache_bytes: int | None = None,
                 vocab: Seq[int] | None = None, keep_prompt: bool = False) -> None:
        if (model is None) == (executor is None):
            raise ValueError("Engine needs exactly one of a model or an executor")
        if executor is None:
            executor = LocalExecutor(model, num_slots=num_slots, max_len=max_len, compile=compile,
                                     packed_weights=packed_weights, kv_cache_bytes=kv_cache_bytes, vocab=vocab,
                                     keep_prompt=keep_prompt)
            # In process the executor's cache is the slot pool, so `engine.cache` is the real thing.
            slots = executor.cache
        else:
            slots = SlotPool(executor.num_slots)
        self.executor = executor
        self.config = executor.config
        self.max_len = executor.max_len
        self.cache = slots
        """The KV-cache slot pool (``num_free``, ...); the ``KVCache`` itself when in process."""
        self.scheduler = Scheduler(self.config, slots, self.max_len, prefix_cache=prefix_cache)
        self.last_result: StepResult | None = None
        """The executor's answer to the latest step: ``hops``, ``stage_seconds`` (read-only)."""

    @classmethod
    def from_pretrained(cls, path: str | Path, *, num_slots: int = 8, max_len: int | None = None,
                        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                        compile: bool = False, prefix_cache: bool = False,
                        packed_weights: bool = False, kv_cache_bytes: int | None = None,
                        vocab: Seq[int] | None = None, keep_prompt: bool = False) -> Engine:
        """An engine over the checkpoint at ``path`` (single process, no parallelism)."""
        return cls(load_model(path, dtype=dtype, device=device), num_slots=num_slots, max_len=max_len,
                   compile=compile, prefix_cache=prefix_cache, packed_weights=packed_weights,
                   kv_cache_bytes=kv_cache_bytes, vocab=vocab, keep_prompt=keep_prompt)

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_work

    @property
    def num_unfinished(self) -> int:
        """Requests waiting or running."""
        return self.scheduler.num_unfinished

    @property
    def last_hops(self) -> list[Hop]:
        """Every hop of the latest step (empty in process, or before the first step)."""
        return self.last_result.hops if self.last_result is not None else []

    def add(self, request_id: str, prompt_ids: Seq[int], params: SamplingParams | None = None) -> None:
        """Queue a request; it is prefilled by the first ``step()`` that finds a free slot.

        Raises ``EmptyPrompt``, ``TokenOutOfRange``, ``PromptTooLong`` (prompt + ``max_tokens``
        beyond ``max_len``) or ``DuplicateRequest``, before anything is queued.
        """
        self.scheduler.add(request_id, prompt_ids, params)

    def abort(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its slot; ``False`` if it is unknown."""
        return self.scheduler.abort(request_id)

    def step(self) -> list[StepOutput]:
        """Prefill newly admitted requests and decode one token for each running one."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        self.last_result = self.executor.execute(batch)
        return self.scheduler.postprocess(self.last_result)

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[int]]:
        """Generate for every prompt (continuously batched) and return the new tokens of each.

        For offline use on an idle engine: it drives ``step()`` itself, so it refuses to run while
        requests added with ``add`` are in flight (their outputs would be swallowed).
        """
        if self.has_work:
            raise RuntimeError("generate() needs an idle engine; drive add()/step() instead")
        params_list = params_per_prompt(prompts, params)
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

    def prompt_logits(self, prompt_ids: Seq[int]) -> torch.Tensor:
        """Debug: the logits ``[S, V]`` of every prompt position, as the executor's last stage has them.

        Runs one extra prefill in a free slot (``CacheFull`` if none) between steps; running
        requests are not disturbed.
        """
        return self.executor.prompt_logits([int(t) for t in prompt_ids], self.scheduler.reserve(prompt_ids))
