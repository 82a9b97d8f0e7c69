"""``LaneEngine``: the small async interface every engine behind a lane implements.

A lane tokenizes, checks the context budget and coalesces; the engine only turns prompt token
ids into a stream of ``EngineOutput``s and frees the sequence when the stream is closed early.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from sharding.sampling import Logprobs, SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    """One generation, tokenized and within the context budget."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k
    min_p: float = SamplingParams.min_p
    repetition_penalty: float = SamplingParams.repetition_penalty
    presence_penalty: float = SamplingParams.presence_penalty
    frequency_penalty: float = SamplingParams.frequency_penalty
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs (``sharding.sampling.SamplingParams.logit_bias``)."""
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: tuple[int, ...] = ()
    """Ids that end the generation (in ``token_ids``, not in the text, as vLLM): the request's, and the
    lane's model's end-of-turn ids (``serve.chat.end_of_turn_ids``) unless ``ignore_eos``."""
    min_tokens: int = 0
    """No stop token, eos or stop string ends the output before it has this many tokens."""
    logprobs: int | None = None
    """Report each token's ``Logprobs`` with this many most likely tokens (``None``: none)."""
    ignore_eos: bool = False
    continues: bool = False
    """The prompt continues an earlier one (a conversation's next turn, ``PromptIds.encode_turn``):
    vLLM's lanes keep its sequence for the turn after (``vllm_sessions``)."""
    trace: Any = None
    """The lane span's OpenTelemetry context when tracing is on (the engine adds step spans under it)."""

    def sampling(self) -> SamplingParams:
        """Its sampling parameters as fastmode's own engines take them (``sharding.sampling``)."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              seed=self.seed, max_tokens=self.max_tokens, min_tokens=self.min_tokens,
                              ignore_eos=self.ignore_eos, stop_token_ids=self.stop_token_ids,
                              repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias,
                              logprobs=self.logprobs)

    def vllm_sampling(self, **kw: Any) -> Any:
        """Its sampling parameters as vLLM's ``SamplingParams`` (``kw``: vLLM's own options)."""
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                  min_p=self.min_p, seed=self.seed, max_tokens=self.max_tokens,
                                  min_tokens=self.min_tokens, stop=self.stop or None,
                                  stop_token_ids=list(self.stop_token_ids) or None, ignore_eos=self.ignore_eos,
                                  repetition_penalty=self.repetition_penalty,
                                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                                  logit_bias=dict(self.logit_bias) or None, logprobs=self.logprobs, **kw)


@dataclass(frozen=True)
class EngineOutput:
    """What one engine step added to one request."""

    token_ids: list[int]
    """New tokens (an eos token that ended the sequence included)."""
    text: str
    """New text (special tokens skipped; a stop string and what follows it never appear)."""
    finish_reason: str | None = None
    """``"stop"`` (eos or a stop string), ``"length"`` (max tokens), or ``None`` while running."""
    queue_s: float | None = None
    """On the first output: seconds from arrival at the engine to the step that started it."""
    batch_size: int | None = None
    """On the first output: sequences in the engine at that step."""
    cached_tokens: int | None = None
    """On the first output: prompt tokens whose keys and values were reused from an earlier
    request (prefix caching: vLLM's automatic prefix cache, the fast lane's ``sharding.prefix_cache``)."""
    hops: list[dict[str, Any]] | None = None
    """On the last output of an engine whose chips hand each step on (the fast lane's): every
    chip-to-chip hop of the request's steps, per chip pair (``HopTotals.per_pair``)."""
    logprobs: list[Logprobs] | None = None
    """One ``sharding.sampling.Logprobs`` per token of ``token_ids``, when the request asked for them."""
    speculative: dict[str, Any] | None = None
    """On the last output of a speculative engine (the exact lane's): ``draft_tokens`` (the configured k,
    the most a round drafts),
    ``verify_steps``, ``drafted``, ``accepted``, ``acceptance_rate`` (accepted / drafted) and
    ``tokens_per_step`` (tokens each verify step produced, the bonus token included)."""


class LaneEngine(Protocol):
    """An engine as a lane sees it."""

    max_len: int
    """Tokens per sequence (prompt + output)."""

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream the request's outputs; the last one has a ``finish_reason``.

        Closing the iterator early (``aclose`` or cancelling the task that drives it) aborts the
        request: its sequence leaves the engine at the next step.
        """
        ...

    def failure(self) -> BaseException | None:
        """Why the engine has died (a chip, the ring or the engine process is gone), else ``None``.
        A dead engine does not come back: the lane builds a new one (``Lane``)."""
        ...

    def num_unfinished(self) -> int:
        """Requests the engine holds (waiting or running)."""
        ...

    async def check_health(self) -> None:
        """Raise ``LaneUnavailable`` if the engine has died."""
        ...

    def shutdown(self) -> None:
        """Release the engine (processes, actors, chips)."""
        ...
