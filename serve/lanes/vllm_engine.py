"""``VLLMLaneEngine``: vLLM's ``AsyncLLM`` behind the ``LaneEngine`` interface.

The priority and standard lanes are this same engine with a different ``max_num_seqs`` (the
batch cap that makes priority fast per user and expensive per token); the exact lane adds vLLM's
speculative decoding with the fast model drafting (``method: draft_model``) and reports each
request's acceptance (vLLM's ``per_request_spec_decode_metrics``). Prompts arrive as token ids,
tokenized by the lane, so every lane sees exactly the same prompt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from sharding import cpus
from sharding.sampling import GREEDY_BELOW, Logprobs

from ..config import ExactLaneConfig, VLLMLaneConfig
from ..errors import LaneUnavailable, UnsupportedParameter
from .engine import EngineOutput, EngineRequest
from .vllm_sessions import eligible
from .vllm_sizing import vllm_sizes


def speculative_args(config: VLLMLaneConfig, draft_path: str | Path | None) -> dict:
    """vLLM engine arguments of the exact lane's speculative decoding (none for other lanes)."""
    if not isinstance(config, ExactLaneConfig) or draft_path is None:
        return {}
    spec = {"method": "draft_model", "model": str(draft_path),
            "num_speculative_tokens": config.num_speculative_tokens}
    if config.num_speculative_tokens_per_batch_size:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in config.num_speculative_tokens_per_batch_size]
    return {"speculative_config": spec, "per_request_spec_decode_metrics": "summary"}


def speculative_summary(m: dict) -> dict:
    """``EngineOutput.speculative`` from vLLM's ``RequestSpecDecodeMetrics.to_dict()``."""
    return {"draft_tokens": m["num_spec_tokens"], "verify_steps": m["num_spec_steps"],
            "drafted": m["num_draft_tokens"], "accepted": m["num_accepted_draft_tokens"],
            "acceptance_rate": m["draft_acceptance_rate"], "tokens_per_step": m["mean_acceptance_length"]}


def vllm_logprobs(c, n: int | None) -> list[Logprobs] | None:
    """``EngineOutput.logprobs`` of vLLM's ``CompletionOutput`` ``c`` (its ``logprobs``: per new token, a
    dict of the token's and the top ``n`` tokens' ``Logprob``s with their ranks)."""
    if n is None or c.logprobs is None:
        return None
    out = []
    for token, step in zip(c.token_ids, c.logprobs, strict=True):
        top = sorted(((t, lp) for t, lp in step.items() if lp.rank is not None and lp.rank <= n), key=lambda x: x[1].rank)
        out.append((step[token].logprob, tuple(t for t, _ in top), tuple(lp.logprob for _, lp in top)))
    return out


def executor_backend(config: VLLMLaneConfig) -> str | None:
    """vLLM's ``distributed_executor_backend`` for the lane's ``executor`` (``None``: vLLM's default)."""
    if config.executor != "auto":
        return config.executor
    parallel = max(int(config.engine_args.get(k, 1) or 1) for k in
                   ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
    return "uni" if parallel == 1 else None


class VLLMLaneEngine:
    """The full model on vLLM (``AsyncLLM``), one engine per Serve replica."""

    speculative = False
    """The exact lane on vLLM: its speculative decoding (``check_request``)."""

    def __init__(self, path: str | Path, config: VLLMLaneConfig, draft_path: str | Path | None = None) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        sizes = vllm_sizes(json.loads((Path(path) / "config.json").read_text()), config)
        args = AsyncEngineArgs(model=str(path), dtype=config.dtype, max_num_seqs=config.max_num_seqs,
                               max_model_len=sizes["max_model_len"],
                               kv_cache_memory_bytes=sizes["kv_cache_memory_bytes"],
                               gpu_memory_utilization=config.gpu_memory_utilization,
                               enforce_eager=config.enforce_eager, seed=0,
                               **speculative_args(config, draft_path),
                               **({"block_size": config.block_size} if config.block_size else {})
                               | ({"distributed_executor_backend": backend} if (backend := executor_backend(config))
                                  else {})
                               | config.engine_args)
        if backend:
            # vLLM's CPU platform turns "uni" into "mp" unless this is "0"; AsyncLLM reads it nowhere else
            # (its engine core is a process of its own either way).
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if backend == "uni" else "1"
        if (bind := cpus.vllm_omp_bind()) and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind  # the workers on the compute cores (sharding/cpus.py)
        if backend == "uni" and cpus.plan() is not None:
            # The model runs in the engine-core process, which inherits this replica's CPUs when spawned:
            # spawn it on the compute cores, then put this replica back on the serving ones.
            with cpus.placed("compute"):
                self.engine = AsyncLLM.from_engine_args(args)
            cpus.place("serving")
        else:
            self.engine = AsyncLLM.from_engine_args(args)
        if self.engine.vllm_config.parallel_config.world_size == 1:
            cpus.place_pollers(os.getpid())  # its gloo threads, with no collective to run, off the compute cores
        self.max_len = self.engine.model_config.max_model_len
        self.speculative = bool(speculative_args(config, draft_path))
        self.sessions = None
        """Conversations kept in vLLM between turns (``vllm_sessions``); ``None`` when off, and always
        on the exact lane's vLLM engine (speculative decoding with streaming input is not tested together)."""
        if config.sessions and not speculative_args(config, draft_path):
            from tokenizers import Tokenizer

            from .vllm_sessions import Sessions

            cache = self.engine.vllm_config.cache_config
            self.sessions = Sessions(self.engine, Tokenizer.from_file(str(Path(path) / "tokenizer.json")),
                                     config.max_num_seqs, config.session_idle_s,
                                     kv_tokens=(cache.num_gpu_blocks or 0) * cache.block_size or None)

    def check_request(self, request: EngineRequest) -> None:
        """Refuse by name, before the lane accepts it, what vLLM's speculative decoding refuses
        (``SamplingParams._validate_spec_decode``: ``logit_bias``, and ``min_p`` above 0, which changes
        only sampled output; the router sends sampled exact-tier requests to priority, ``route.sampled_on``)."""
        if not self.speculative:
            return
        why = ("not served by the exact lane on vLLM (lanes.exact.engine: vllm), whose speculative decoding "
               "does not take it; the priority lane (the same model) or the exact lane's fastmode engine serve it")
        if request.logit_bias:
            raise UnsupportedParameter(f"logit_bias: {why}")
        if request.min_p > GREEDY_BELOW and request.temperature >= GREEDY_BELOW:
            raise UnsupportedParameter(f"min_p: {why}")

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """See ``LaneEngine.generate``; vLLM aborts the request when this generator is closed."""
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self.engine.errored:
            raise LaneUnavailable(f"the vLLM engine has died: {self.engine.dead_error!r}")
        self.check_request(request)
        if self.speculative and request.temperature < GREEDY_BELOW and request.min_p:
            request = dataclasses.replace(request, min_p=0.0)  # greedy: min_p changes nothing (vLLM's sampler too)
        params = request.vllm_sampling(output_kind=RequestOutputKind.DELTA)
        if self.sessions is not None:
            if eligible(request):
                first = True
                async with contextlib.aclosing(self.sessions.turn(request, params)) as turn:
                    async for out, text, reused in turn:  # closed at once when the caller stops (a cancel)
                        c = out.outputs[0]
                        extra = {}
                        if first:
                            first = False
                            # a continued session reuses every token it had computed; a new one what
                            # the prefix cache held
                            extra = {"batch_size": self.num_unfinished(),
                                     "cached_tokens": reused or getattr(out, "num_cached_tokens", None)}
                        yield EngineOutput(list(c.token_ids), text, c.finish_reason,
                                           logprobs=vllm_logprobs(c, request.logprobs), **extra)
                return
            await self.sessions.make_room()  # parked sessions hold vLLM slots: free one for this request
        prompt = TokensPrompt(prompt_token_ids=request.prompt_ids)
        first = True
        async for out in self.engine.generate(prompt, params, request.request_id):
            c = out.outputs[0]
            extra = {}
            if first:
                first = False
                stats = getattr(out, "metrics", None)  # vLLM's RequestStateStats (engine-core clock)
                queued, scheduled = getattr(stats, "queued_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
                extra = {"queue_s": scheduled - queued if queued and scheduled else None,
                         "batch_size": self.num_unfinished(),
                         "cached_tokens": getattr(out, "num_cached_tokens", None)}
            if out.finished and getattr(c, "spec_decode_metrics", None) is not None:
                extra["speculative"] = speculative_summary(c.spec_decode_metrics.to_dict())
            yield EngineOutput(list(c.token_ids), c.text, c.finish_reason if out.finished else None,
                               logprobs=vllm_logprobs(c, request.logprobs), **extra)

    def failure(self) -> BaseException | None:
        return (self.engine.dead_error or RuntimeError("the vLLM engine has died")) if self.engine.errored else None

    def num_unfinished(self) -> int:
        """Requests in the engine, parked sessions not counted (they hold a slot, not a stream)."""
        parked = len(self.sessions.parked) if self.sessions is not None else 0
        return self.engine.get_num_unfinished_requests() - parked

    async def check_health(self) -> None:
        if self.engine.errored:
            raise LaneUnavailable(f"the vLLM engine has died: {self.engine.dead_error!r}")
        await self.engine.check_health()

    def shutdown(self) -> None:
        self.engine.shutdown()
