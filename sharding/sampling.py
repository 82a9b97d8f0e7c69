"""Per-request sampling parameters and the batched sampler.

Reproducibility: a seeded request draws its noise only from its own ``torch.Generator``, one
draw of ``vocab`` numbers per token, so it yields the same tokens alone or in any batch (given
the same logits). Sampling uses the exponential-race form of a categorical draw,
``argmax(p / E)`` with ``E ~ Exp(1)``, which needs no cumulative sum and batches trivially.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import InvalidSamplingParams


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one request picks its tokens and when it stops."""

    temperature: float = 1.0
    """Softmax temperature; ``0`` (or anything below ``GREEDY_BELOW``) means greedy (argmax). The
    default, 1.0, is vLLM's and OpenAI's, and the one every front door uses
    (``serve.request.GenerateRequest`` takes it from here)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the most likely tokens whose mass reaches ``top_p``; in ``(0, 1]``."""
    seed: int | None = None
    """Seed of this request's own generator; ``None`` draws a fresh seed."""
    stop_token_ids: tuple[int, ...] = ()
    """Finish after emitting any of these (in addition to the model's eos ids)."""
    max_tokens: int = 16
    """Most tokens to generate; the prompt plus this must fit the context window."""
    ignore_eos: bool = False
    """Keep going past the model's eos ids (``stop_token_ids`` still stop)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise InvalidSamplingParams(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise InvalidSamplingParams(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise InvalidSamplingParams(f"seed must be None or an int >= 0, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidSamplingParams(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        bad = [t for t in self.stop_token_ids if not _is_int(t) or t < 0]
        if bad:
            raise InvalidSamplingParams(f"stop_token_ids must be ints >= 0, got {bad}")

    @property
    def greedy(self) -> bool:
        """Whether this request takes the argmax."""
        return self.temperature < GREEDY_BELOW


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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits: [B, V]`` -> ``[B]`` (long), row ``i`` following ``params[i]``.

    ``generators[i]`` must be the request's generator (``make_generator``) for sampled rows; it
    is advanced by exactly one draw per call.
    """
    greedy = logits.argmax(dim=-1)
    if all(p.greedy for p in params):
        return greedy
    device = logits.device
    temperature = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    probs = torch.softmax(logits.float() / temperature[:, None], dim=-1)
    if any(p.top_p < 1 for p in params):
        probs = top_p_filter(probs, top_p)
    noise = torch.ones_like(probs)
    # One draw per sampled row from its own generator: the price of batch-independent seeds.
    for i, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            noise[i].exponential_(generator=gen)
    sampled = (probs / noise).argmax(dim=-1)
    is_greedy = torch.tensor([p.greedy for p in params], device=device)
    return torch.where(is_greedy, greedy, sampled)
