"""Sampling params validation and the batched sampler: greedy, temperature, top-p, per-request seeds."""

from __future__ import annotations

import pytest
import torch

from sharding.errors import InvalidSamplingParams
from sharding.sampling import SamplingParams, make_generator, sample, top_p_filter
from sharding.speculative import warp


@pytest.mark.parametrize("kwargs", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0), dict(top_p=1.5),
    dict(seed=-1), dict(seed=1.5), dict(max_tokens=0), dict(max_tokens=True), dict(stop_token_ids=[-3]),
])
def test_invalid_params(kwargs):
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams(**kwargs)
    assert info.value.code == "invalid_sampling_params" and isinstance(info.value, ValueError)


def test_stop_token_ids_become_a_tuple():
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


def test_greedy_is_argmax_and_draws_nothing():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0)] * 5
    assert make_generator(params[0]) is None
    assert torch.equal(sample(logits, params, [None] * 5), logits.argmax(-1))


def test_top_p_keeps_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]])
    kept = top_p_filter(probs, torch.tensor([0.8, 0.01]))
    assert torch.equal(kept > 0, torch.tensor([[True, True, False, False], [False, False, False, True]]))
    assert torch.equal(top_p_filter(probs, torch.tensor([1.0, 1.0])), probs)


def test_seeded_row_is_the_same_alone_or_in_any_batch():
    g = torch.Generator().manual_seed(1)
    row = torch.randn(1, 40, generator=g)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=42)
    alone_gen = make_generator(seeded)
    alone = [sample(row, [seeded], [alone_gen]).item() for _ in range(30)]
    other = SamplingParams(temperature=0.7)
    batch_gens = [make_generator(other), make_generator(seeded), None]
    batch = []
    for _ in range(30):
        logits = torch.cat([torch.randn(1, 40, generator=g), row, torch.randn(1, 40, generator=g)])
        batch.append(sample(logits, [other, seeded, SamplingParams(temperature=0)], batch_gens)[1].item())
    assert batch == alone and len(set(alone)) > 1


def test_temperature_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    n = 3000
    params = [SamplingParams(temperature=1.0, seed=7)] * n
    gens = [make_generator(params[0])] + [None] * (n - 1)
    gen = gens[0]
    draws = sample(probs.log().expand(n, 3), params, [gen] * n)
    freq = torch.bincount(draws, minlength=3).float() / n
    assert (freq - probs).abs().max() < 0.04
    # Low temperature sharpens towards the argmax.
    cold = [SamplingParams(temperature=0.05)] * 200
    cold_draws = sample(probs.log().expand(200, 3), cold, [make_generator(cold[0])] * 200)
    assert (cold_draws == 0).all()


@pytest.mark.parametrize("params", [SamplingParams(temperature=1e-300, seed=1),
                                    SamplingParams(temperature=1e-45, seed=1),
                                    SamplingParams(temperature=1.0, top_p=1e-300, seed=1)])
def test_sampling_values_too_small_for_float32_still_take_the_most_likely_token(params):
    """Hostile sampling values: a temperature of 1e-300 is 0 in float32 (the logits divided by it are
    inf, their softmax NaN) and a top_p of 1e-300 dropped every token; both sampled token 0."""
    logits = torch.zeros(1, 50)
    logits[0, 7] = 10.0
    assert sample(logits, [params], [make_generator(params)]).item() == 7


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-45])
def test_top_p_too_small_for_float32_keeps_the_most_likely_token(top_p):
    """A top_p that is 0 in float32 kept no token (the speculative engine's warp then divided 0 by 0 and
    ``torch.multinomial`` refused the NaNs: CI's fuzz found it on the exact lane)."""
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    kept = top_p_filter(probs, torch.tensor([top_p] * 3))
    assert torch.equal(kept.nonzero()[:, 1], probs.argmax(dim=-1))
    warped = warp(probs.log(), SamplingParams(temperature=1.0, top_p=top_p))
    assert torch.equal(warped, torch.nn.functional.one_hot(probs.argmax(dim=-1), 50).float())
