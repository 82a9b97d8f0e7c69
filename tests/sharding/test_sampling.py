"""Sampling params validation and the batched sampler: greedy, temperature, top-p, per-request seeds,
and the logits processing (top-k, min-p, min_tokens, logit_bias, the penalties) against
transformers' logits processors and vLLM's sampler functions."""

from __future__ import annotations

import pytest
import torch

from sharding.errors import InvalidSamplingParams
from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper)

from sharding.sampling import (History, SamplingParams, filtered_probs, make_generator, processed, sample,
                               top_p_filter, warp)


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


# -- logits processing against references we did not write ------------------------------------------
# transformers' logits processors (and vLLM's own penalty and top-k/top-p functions) applied to the
# same logits must give what ``History.apply`` and ``filtered_probs`` give.
V = 64


def _logits(rows: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _history(params: SamplingParams, prompt: list[int], output: list[int], eos=(1,)) -> History:
    h = History(params, prompt, V, eos)
    h.append(output)
    return h


PROMPT, OUTPUT = [0, 5, 9, 9, 17], [9, 33, 33, 33, 40, 5]


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_repetition_penalty_is_transformers(penalty):
    logits = _logits()
    ids = torch.tensor([PROMPT + OUTPUT] * logits.shape[0])
    want = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    h = _history(SamplingParams(repetition_penalty=penalty), PROMPT, OUTPUT)
    ours = processed(logits, [h] * logits.shape[0])
    torch.testing.assert_close(ours, want)
    assert not torch.equal(ours, logits)


def test_logit_bias_is_transformers_sequence_bias():
    logits = _logits()
    bias = {3: 5.0, 40: -100.0, 7: 0.5}
    want = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(torch.tensor([PROMPT] * 4), logits.clone())
    ours = processed(logits, [_history(SamplingParams(logit_bias=bias), PROMPT, [])] * 4)
    torch.testing.assert_close(ours, want)


@pytest.mark.parametrize("done", [0, 2, 3, 5])
def test_min_tokens_masks_stops_and_eos_like_transformers_min_new_tokens(done):
    """Until ``min_tokens`` are out, the eos ids and ``stop_token_ids`` cannot be drawn; then they can."""
    logits = _logits()
    eos, stops = [1, 2], (11,)
    output = OUTPUT[:done]
    want = MinNewTokensLengthLogitsProcessor(len(PROMPT), 3, eos + list(stops))(
        torch.tensor([PROMPT + output] * 4), logits.clone())
    h = _history(SamplingParams(min_tokens=3, stop_token_ids=stops, max_tokens=8), PROMPT, output, eos)
    torch.testing.assert_close(processed(logits, [h] * 4), want)
    assert torch.isinf(want[:, [1, 2, 11]]).all() == (done < 3)


@pytest.mark.parametrize("temperature,top_k,min_p", [(1.0, 5, 0.0), (0.6, 1, 0.0), (1.0, 0, 0.1), (1.7, 0, 0.3),
                                                      (0.8, 7, 0.05), (1.0, V + 10, 0.0)])
def test_top_k_and_min_p_are_transformers_warpers(temperature, top_k, min_p):
    """After the temperature, ``min_p`` then ``top_k`` (vLLM's order; the two commute) keep exactly the
    tokens transformers' ``MinPLogitsWarper`` and ``TopKLogitsWarper`` keep, with the same probabilities."""
    logits = _logits()
    logits[0, 10] = logits[0, 11] = logits[0].max() + 1  # a tie at the top
    want = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if min_p:
        want = MinPLogitsWarper(min_p)(None, want)
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    params = SamplingParams(temperature=temperature, top_k=top_k, min_p=min_p)
    ours = filtered_probs(logits, [params] * 4)
    torch.testing.assert_close(ours, torch.softmax(want, dim=-1))
    torch.testing.assert_close(warp(logits, params), torch.softmax(want, dim=-1))


def test_penalties_and_top_k_top_p_are_vllms():
    """vLLM's own ``apply_penalties`` (repetition, frequency, presence, mixed per row) and
    ``apply_top_k_top_p`` (top-p over the tokens top-k kept) on the same logits."""
    from vllm.model_executor.layers.utils import apply_penalties
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits = _logits()
    params = [SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=-0.3),
              SamplingParams(frequency_penalty=2.0), SamplingParams(presence_penalty=1.5, repetition_penalty=0.9),
              SamplingParams()]
    prompts, outputs = [PROMPT, [3, 4], PROMPT[:2], [8]], [OUTPUT, OUTPUT[:3], [7, 7, 5], [8, 8]]
    pad = lambda rows: torch.tensor([r + [V] * (max(map(len, rows)) - len(r)) for r in rows])  # noqa: E731
    want = apply_penalties(logits.clone(), pad(prompts), pad(outputs),
                           torch.tensor([p.presence_penalty for p in params]),
                           torch.tensor([p.frequency_penalty for p in params]),
                           torch.tensor([p.repetition_penalty for p in params]))
    hs = [_history(p, pr, o) if p.uses_history else None for p, pr, o in zip(params, prompts, outputs)]
    torch.testing.assert_close(processed(logits, hs), want)

    top_k, top_p = [3, 0, 12, 1], [0.7, 0.5, 1.0, 0.9]
    masked = apply_top_k_top_p(logits.clone(), torch.tensor([k or V for k in top_k]), torch.tensor(top_p))
    ours = filtered_probs(logits, [SamplingParams(top_k=k, top_p=p) for k, p in zip(top_k, top_p)])
    assert torch.equal(ours > 0, torch.isfinite(masked))


def test_greedy_takes_the_argmax_of_the_processed_logits():
    logits = _logits(2)
    params = [SamplingParams(temperature=0, logit_bias={int(logits[0].argmin()): 100}),
              SamplingParams(temperature=0)]
    hs = [_history(params[0], PROMPT, []), None]
    assert sample(logits, params, [None, None], hs).tolist() == [int(logits[0].argmin()), int(logits[1].argmax())]


def test_processed_sampling_is_seeded_and_the_same_alone_or_in_a_batch():
    """A row with penalties, top-k and min-p draws the same tokens whatever shares its batch."""
    g = torch.Generator().manual_seed(3)
    row = torch.randn(1, V, generator=g)
    mine = SamplingParams(temperature=0.9, top_k=20, min_p=0.02, repetition_penalty=1.3, presence_penalty=0.5,
                          frequency_penalty=0.4, seed=11, max_tokens=40)
    other = SamplingParams(temperature=1.0, top_p=0.8, seed=5)

    def run(batched: bool) -> list[int]:
        h, gen, og, out = History(mine, PROMPT, V), make_generator(mine), make_generator(other), []
        for _ in range(30):
            if batched:
                logits = torch.cat([torch.randn(1, V, generator=g), row])
                t = sample(logits, [other, mine], [og, gen], [None, h])[1].item()
            else:
                t = sample(row, [mine], [gen], [h]).item()
            h.append([t])
            out.append(t)
        return out

    alone = run(False)
    assert run(True) == alone == run(False) and len(set(alone)) > 1


@pytest.mark.parametrize("kwargs", [
    dict(top_k=-2), dict(top_k=1.5), dict(min_p=1.1), dict(min_p=-0.1), dict(min_tokens=-1),
    dict(min_tokens=17), dict(repetition_penalty=0), dict(repetition_penalty=float("inf")),
    dict(presence_penalty=2.1), dict(frequency_penalty=-3), dict(logit_bias={1: 101}), dict(logit_bias={-1: 0}),
])
def test_invalid_processing_params(kwargs):
    with pytest.raises(InvalidSamplingParams):
        SamplingParams(**kwargs)
