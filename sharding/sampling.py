"""Per-request sampling parameters, the logits processing they ask for, and the batched sampler.

Processing follows vLLM's sampler (``vllm/v1/sample/sampler.py``), in its order, so that every lane
gives a parameter the same meaning:

1. ``min_tokens`` (stop and eos ids masked until that many tokens are out), then ``logit_bias``,
   then the penalties (repetition, frequency, presence): these change the argmax, so greedy
   requests take the argmax of the processed logits;
2. sampled requests only: temperature, then ``min_p``, then ``top_k``, then ``top_p`` (on the
   distribution the tokens kept so far make, renormalized).

The first step looks at the sequence's tokens so far: a ``History`` per sequence holds what it needs
(its output count, each token's count in the output, the tokens its prompt holds), and the engine
that samples appends each token it emits. A sequence without those parameters has none.

Reproducibility: a seeded request draws its noise only from its own ``torch.Generator``, one
draw of ``vocab`` numbers per token, so it yields the same tokens alone or in any batch (given
the same logits). Sampling uses the exponential-race form of a categorical draw,
``argmax(p / E)`` with ``E ~ Exp(1)``, which needs no cumulative sum and batches trivially.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from .errors import InvalidSamplingParams


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request picks its tokens and when it stops (the fields vLLM's ``SamplingParams`` has
    under the same names, with the same meaning and ranges)."""

    temperature: float = 1.0
    """Softmax temperature; ``0`` (or anything below ``GREEDY_BELOW``) means greedy (argmax). The
    default, 1.0, is vLLM's and OpenAI's, and the one every front door uses when neither the
    request nor the model's ``generation_config.json`` sets one."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens whose mass reaches ``top_p``; in ``(0, 1]``."""
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens (and any tied with the last of them); ``0`` or ``-1``: all."""
    min_p: float = 0.0
    """Drop the tokens less likely than ``min_p`` times the most likely one (after temperature); in [0, 1]."""
    seed: int | None = None
    """Seed of this request's own generator; ``None`` draws a fresh seed."""
    stop_token_ids: tuple[int, ...] = ()
    """Finish after emitting any of these (in addition to the model's eos ids)."""
    max_tokens: int = 16
    """Most tokens to generate; the prompt plus this must fit the context window."""
    min_tokens: int = 0
    """Generate at least this many tokens: until then ``stop_token_ids`` and the model's eos ids
    cannot be sampled (their logits are -inf). At most ``max_tokens``."""
    ignore_eos: bool = False
    """Keep going past the model's eos ids (``stop_token_ids`` still stop)."""
    repetition_penalty: float = 1.0
    """> 0: the logit of every token in the prompt or the output so far is divided by it when
    positive and multiplied by it when negative (CTRL's rule, as transformers' and vLLM's); 1: off."""
    presence_penalty: float = 0.0
    """In [-2, 2]: subtracted from the logit of every token the output holds (OpenAI's)."""
    frequency_penalty: float = 0.0
    """In [-2, 2]: subtracted from each token's logit once per time the output holds it (OpenAI's)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs, each bias in [-100, 100], added to those tokens' logits (OpenAI's);
    a mapping is accepted and kept as pairs sorted by token."""
    logprobs: int | None = None
    """Report each generated token's log probability and those of the ``logprobs`` most likely tokens
    (``Logprobs``; 0: its own only; at most ``MAX_LOGPROBS``); ``None``: none."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((t, b) for t, b in bias)))
        if not (_is_number(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidSamplingParams(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidSamplingParams(f"top_k must be an int >= 1, or 0 or -1 (off), got {self.top_k!r}")
        if not (_is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise InvalidSamplingParams(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise InvalidSamplingParams(f"seed must be None or an int >= 0, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidSamplingParams(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidSamplingParams(f"min_tokens must be an int in [0, max_tokens {self.max_tokens}], "
                                        f"got {self.min_tokens!r}")
        bad = [t for t in self.stop_token_ids if not _is_int(t) or t < 0]
        if bad:
            raise InvalidSamplingParams(f"stop_token_ids must be ints >= 0, got {bad}")
        if not (_is_number(self.repetition_penalty) and math.isfinite(self.repetition_penalty)
                and self.repetition_penalty > 0):
            raise InvalidSamplingParams(f"repetition_penalty must be a finite number > 0, got "
                                        f"{self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -2 <= value <= 2):
                raise InvalidSamplingParams(f"{name} must be in [-2, 2], got {value!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise InvalidSamplingParams(f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        bad = [(t, b) for t, b in self.logit_bias
               if not _is_int(t) or t < 0 or not _is_number(b) or not -100 <= b <= 100]
        if bad:
            raise InvalidSamplingParams(f"logit_bias must map token ids >= 0 to biases in [-100, 100], got {bad[:5]}")

    @property
    def greedy(self) -> bool:
        """Whether this request takes the argmax."""
        return self.temperature < GREEDY_BELOW

    @property
    def uses_history(self) -> bool:
        """Whether its logits processing looks at more than the logits (``History``): ``min_tokens``,
        ``logit_bias`` or a penalty."""
        return bool(self.min_tokens or self.logit_bias or self.uses_prompt
                    or self.presence_penalty or self.frequency_penalty)

    @property
    def uses_prompt(self) -> bool:
        """Whether its processing looks at the prompt's tokens (a repetition penalty)."""
        return self.repetition_penalty != 1


MAX_LOGPROBS = 20
"""The most top log probabilities a request may ask for per token (vLLM's default ``max_logprobs``)."""

Logprobs = tuple[float, tuple[int, ...], tuple[float, ...]]
"""One generated token's log probabilities: its own, then the ids of the most likely tokens, most
likely first, and theirs. Of the raw logits (before any processing or temperature), as vLLM's
default (``logprobs_mode: raw_logprobs``)."""


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: list[int | None]) -> list[Logprobs | None]:
    """``Logprobs`` of ``tokens[i]`` at row ``i`` of the raw ``logits: [B, V]``, with ``top[i]`` most
    likely tokens (``None``: the row asked for none)."""
    out: list[Logprobs | None] = [None] * len(tokens)
    rows = [i for i, n in enumerate(top) if n is not None]
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), dim=-1)  # [R, V]
    own = lp.gather(-1, torch.tensor([tokens[i] for i in rows], device=lp.device)[:, None])[:, 0].tolist()
    k = max(top[i] for i in rows)
    values, ids = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    values, ids = values.tolist(), ids.tolist()
    for j, i in enumerate(rows):
        out[i] = (own[j], tuple(ids[j][:top[i]]), tuple(values[j][:top[i]]))
    return out


GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy, as in vLLM (its ``_SAMPLING_EPS``): dividing by one that small
overflows the logits (1e-300 is 0 in float32), and the softmax of those is no distribution."""


def params_per_prompt(prompts: list, params: SamplingParams | list[SamplingParams] | None) -> list:
    """One ``SamplingParams`` (or ``None``) per prompt: ``params`` itself if a list of as many, else repeated."""
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    if len(params_list) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
    return params_list


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The request's own generator (``None`` for greedy requests, which draw nothing)."""
    return None if params.greedy else generator_for_seed(params.seed, device)


def generator_for_seed(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with ``seed`` (``None``: a fresh nondeterministic seed)."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


class History:
    """What one sequence's history-dependent processing (``SamplingParams.uses_history``) needs of its
    tokens so far, and that processing (step 1 of the module docstring) for its next position.

    Args:
        params: the request's parameters.
        prompt: its prompt ids (read for a repetition penalty only).
        vocab_size: the model's vocabulary.
        eos_token_ids: the model's eos ids, masked with ``stop_token_ids`` under ``min_tokens``
            (also with ``ignore_eos``, as vLLM's ``all_stop_token_ids``).
    """

    def __init__(self, params: SamplingParams, prompt: Iterable[int], vocab_size: int,
                 eos_token_ids: Iterable[int] = (), device: torch.device | str = "cpu") -> None:
        self.params = params
        self.generated = 0
        """Tokens the sequence has emitted."""
        p = params
        stops = sorted(t for t in {*p.stop_token_ids, *eos_token_ids} if t < vocab_size)
        self.stops = torch.tensor(stops, dtype=torch.long, device=device) if p.min_tokens and stops else None
        self.bias = None
        if p.logit_bias:
            self.bias = torch.zeros(vocab_size, device=device)
            self.bias[torch.tensor([t for t, _ in p.logit_bias], device=device)] = torch.tensor(
                [float(b) for _, b in p.logit_bias], device=device)
        self.counts = torch.zeros(vocab_size, device=device) if p.presence_penalty or p.frequency_penalty else None
        """``[V]``: how often the output holds each token."""
        self.seen = None
        """``[V]`` bool: which tokens the prompt or the output holds (for a repetition penalty)."""
        if p.uses_prompt:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            ids = torch.tensor(list(prompt), dtype=torch.long, device=device)
            self.seen[ids[ids < vocab_size]] = True

    def append(self, tokens: Iterable[int]) -> None:
        """The sequence emitted ``tokens``."""
        for t in tokens:
            self.generated += 1
            if self.counts is not None:
                self.counts[t] += 1
            if self.seen is not None:
                self.seen[t] = True

    def copy(self) -> History:
        """An independent copy (to process positions of drafted tokens, ``sharding.speculative``)."""
        other = object.__new__(History)
        other.__dict__.update(self.__dict__)
        other.counts = None if self.counts is None else self.counts.clone()
        other.seen = None if self.seen is None else self.seen.clone()
        return other

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Process one float32 row ``logits: [V]`` in place for the sequence's next token; returns it."""
        p = self.params
        if self.stops is not None and self.generated < p.min_tokens:
            logits[self.stops] = -math.inf
        if self.bias is not None:
            logits += self.bias
        if self.seen is not None:
            penalty = torch.where(self.seen, p.repetition_penalty, 1.0)
            logits *= torch.where(logits > 0, 1.0 / penalty, penalty)
        if self.counts is not None:
            logits -= p.frequency_penalty * self.counts + p.presence_penalty * (self.counts > 0)
        return logits


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tail of each row of ``probs: [B, V]`` beyond nucleus mass ``top_p: [B]``.

    A token is kept if the mass of the tokens strictly more likely than it is below ``top_p``,
    so the most likely token always survives. Rows with ``top_p == 1`` are left whole (a cumsum
    can round up to 1 before the tail). A ``top_p`` too small for float32 (5e-324 is 0 there) is
    raised to float32's smallest normal, so the most likely token survives every row.
    """
    top_p = top_p.float().clamp_min(torch.finfo(torch.float32).tiny)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def processed(logits: torch.Tensor, histories: list[History | None]) -> torch.Tensor:
    """``logits: [B, V]`` as float32, row ``i`` processed by ``histories[i]`` (step 1; ``None``: as it is)."""
    out = logits.float()
    if any(h is not None for h in histories):
        out = out.clone() if out is logits else out
        for row, h in zip(out, histories, strict=True):
            if h is not None:
                h.apply(row)
    return out


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Step 2 on processed float32 ``logits: [B, V]``: each row's probabilities at its temperature
    after ``min_p``, ``top_k`` and ``top_p`` (not renormalized after ``top_p``). A greedy row gets
    temperature 1."""
    device, V = logits.device, logits.shape[-1]
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
    scaled = logits / temperature[:, None]
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device)
        probs = torch.softmax(scaled, dim=-1)
        scaled = scaled.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), -math.inf)
    if any(p.top_k > 0 for p in params):
        k = torch.tensor([min(p.top_k, V) if p.top_k > 0 else V for p in params], device=device)
        top = scaled.topk(int(k.max()), dim=-1).values
        kth = top.gather(-1, (k - 1)[:, None])
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if any(p.top_p < 1 for p in params):
        probs = top_p_filter(probs, torch.tensor([p.top_p for p in params], device=device))
    return probs


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution ``[..., V]`` a sampled request draws from, given processed logits: step 2,
    renormalized."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    probs = filtered_probs(flat, [params] * flat.shape[0])
    return (probs / probs.sum(-1, keepdim=True)).view(logits.shape)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           histories: list[History | None] | None = None) -> torch.Tensor:
    """One token per row of ``logits: [B, V]`` -> ``[B]`` (long), row ``i`` following ``params[i]``.

    ``generators[i]`` must be the request's generator (``make_generator``) for sampled rows; it
    is advanced by exactly one draw per call. ``histories[i]``: the row's ``History`` when its
    parameters use one; the caller appends the sampled token to it.
    """
    if histories is not None and any(h is not None for h in histories):
        logits = processed(logits, histories)
    greedy = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        return greedy
    probs = filtered_probs(logits.float(), params)
    noise = torch.ones_like(probs)
    # One draw per sampled row from its own generator: the price of batch-independent seeds.
    for i, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            noise[i].exponential_(generator=gen)
    sampled = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    return torch.where(is_greedy, greedy, sampled)
