"""The single-process engine: greedy parity with transformers, continuous batching, seeds, bad input."""

from __future__ import annotations

import pytest
import torch

from sharding.engine import Engine
from sharding.errors import (
    DuplicateRequest,
    EmptyPrompt,
    InvalidLayout,
    PromptTooLong,
    ShardingError,
    TokenOutOfRange,
)
from sharding.sampling import SamplingParams
from sharding.weights import load_model

from .conftest import hf_greedy, hf_processing, prompt_ids, resolve

GREEDY = SamplingParams(temperature=0, max_tokens=64)
BATCHING = ("tiny-full", "random-tied", "full")
"""Checkpoints with varied greedy output (the tiny fast model repeats one token)."""


def run_until_done(engine: Engine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while engine.has_work:
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.token_ids)
    return out


def test_greedy_64_tokens_match_transformers(checkpoint):
    ids = prompt_ids(checkpoint, 24)
    ours = Engine.from_pretrained(checkpoint, num_slots=1).generate([ids], GREEDY)[0]
    assert ours == hf_greedy(checkpoint, ids, 64)


@pytest.fixture(params=BATCHING)
def batching_checkpoint(request, tiny_dir):
    return resolve(request.param, tiny_dir)


def test_batch_matches_alone(batching_checkpoint):
    path = batching_checkpoint
    engine = Engine.from_pretrained(path, num_slots=4)
    prompts = [prompt_ids(path, n, seed=n) for n in (5, 17, 11, 30)]
    params = SamplingParams(temperature=0, max_tokens=24)
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert engine.generate(prompts, params) == alone
    assert len(set(map(tuple, alone))) > 1


def test_sequence_joining_mid_batch_matches_alone(batching_checkpoint):
    path = batching_checkpoint
    engine = Engine.from_pretrained(path, num_slots=3)
    a, b, c = (prompt_ids(path, n, seed=10 + n) for n in (7, 19, 12))
    params = SamplingParams(temperature=0, max_tokens=16)
    alone = {k: engine.generate([p], params)[0] for k, p in zip("abc", (a, b, c), strict=True)}
    engine.add("a", a, params)
    engine.add("b", b, SamplingParams(temperature=0, max_tokens=5))  # leaves early, freeing its slot
    got: dict[str, list[int]] = {}
    for _ in range(6):
        for o in engine.step():
            got.setdefault(o.request_id, []).extend(o.token_ids)
    assert got["b"] == alone["b"][:5] and engine.cache.num_free == 2
    engine.add("c", c, params)
    for k, v in run_until_done(engine).items():
        got.setdefault(k, []).extend(v)
    assert got["a"] == alone["a"] and got["c"] == alone["c"]
    assert engine.cache.num_free == 3


def test_seeded_sample_same_alone_and_in_batch(batching_checkpoint):
    path = batching_checkpoint
    engine = Engine.from_pretrained(path, num_slots=4)
    ids = prompt_ids(path, 9, seed=5)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20)
    alone = engine.generate([ids], seeded)[0]
    others = [prompt_ids(path, n, seed=n) for n in (4, 13, 21)]
    batch = engine.generate(others[:1] + [ids] + others[1:],
                            [SamplingParams(temperature=1.0, max_tokens=20), seeded,
                             SamplingParams(temperature=0, max_tokens=7),
                             SamplingParams(temperature=0.5, seed=9, max_tokens=20)])
    assert batch[1] == alone
    # A different seed gives a different stream (else the seed would not be doing anything).
    reseeded = SamplingParams(temperature=0.9, top_p=0.95, seed=99, max_tokens=20)
    assert engine.generate([ids], reseeded)[0] != alone


def processing_cases(free: list[int], n: int) -> list[SamplingParams]:
    """Greedy requests whose logits processing changes ``free`` (the plain greedy output): a repetition
    penalty, a logit bias against its second token and for another, and ``min_tokens`` past the first
    time it emits its third token, made a stop token."""
    return [SamplingParams(temperature=0, max_tokens=n, repetition_penalty=1.8),
            SamplingParams(temperature=0, max_tokens=n, logit_bias={free[1]: -100, 7: 4.5}),
            SamplingParams(temperature=0, max_tokens=n, min_tokens=n // 2, stop_token_ids=[free[2]]),
            SamplingParams(temperature=0, max_tokens=n, repetition_penalty=0.8, logit_bias={free[0]: -3})]


def test_processed_greedy_matches_transformers_generate_alone_and_batched(batching_checkpoint):
    """``repetition_penalty``, ``logit_bias`` and ``min_tokens`` give transformers' ``generate`` with its
    ``repetition_penalty``, ``sequence_bias`` and ``min_new_tokens``, token for token; in one batch with
    the others (and with penalised sampled rows) each is what it is alone."""
    path = batching_checkpoint
    engine = Engine.from_pretrained(path, num_slots=6)
    ids = prompt_ids(path, 9, seed=4)
    n = 16
    free = engine.generate([ids], SamplingParams(temperature=0, max_tokens=n))[0]
    cases = processing_cases(free, n)
    alone = [engine.generate([ids], p)[0] for p in cases]
    eos = engine.config.eos_token_ids
    assert alone == [hf_greedy(path, ids, n, **hf_processing(p, eos)) for p in cases]
    assert all(a != free for a in alone)
    sampled = SamplingParams(temperature=0.8, top_k=8, min_p=0.05, presence_penalty=1.0, frequency_penalty=0.5,
                             seed=3, max_tokens=n)
    batched = engine.generate([ids] * (len(cases) + 1), cases + [sampled])
    assert batched[:-1] == alone
    assert batched[-1] == engine.generate([ids], sampled)[0]


def test_requests_wait_for_a_free_slot_and_abort_frees_it(tiny_dir):
    path = tiny_dir / "full"
    engine = Engine.from_pretrained(path, num_slots=2)
    prompts = [prompt_ids(path, 6, seed=s) for s in range(4)]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    alone = [engine.generate([p], params)[0] for p in prompts]
    for i, p in enumerate(prompts):
        engine.add(str(i), p, params)
    first = engine.step()
    assert sorted(o.request_id for o in first) == ["0", "1"] and engine.cache.num_free == 0
    assert engine.abort("1") and not engine.abort("1") and engine.cache.num_free == 1
    assert engine.abort("3")  # still waiting
    out = run_until_done(engine)
    assert out["0"] == alone[0][1:] and out["2"] == alone[2]
    assert "3" not in out and engine.cache.num_free == 2


def test_stop_tokens_and_length(tiny_dir):
    path = tiny_dir / "full"
    engine = Engine.from_pretrained(path)
    ids = prompt_ids(path, 8)
    free = engine.generate([ids], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert len(free) == 12
    stop = free[5]
    engine.add("r", ids, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop], ignore_eos=True))
    outs = [o for _ in range(12) for o in engine.step()]
    assert [o.token_ids[0] for o in outs] == free[: free.index(stop) + 1]
    assert outs[-1].finished and outs[-1].finish_reason == "stop" and not engine.has_work


@pytest.mark.parametrize("prompt, params, error, code", [
    ([], None, EmptyPrompt, "empty_prompt"),
    ([0, 5, 600], None, TokenOutOfRange, "token_out_of_range"),
    ([0, -1], None, TokenOutOfRange, "token_out_of_range"),
    ([0] * 129, SamplingParams(temperature=0, max_tokens=1), PromptTooLong, "prompt_too_long"),
    ([0] * 100, SamplingParams(temperature=0, max_tokens=29), PromptTooLong, "prompt_too_long"),  # context is 128
])
def test_bad_input_raises_typed_errors(tiny_dir, prompt, params, error, code):
    engine = Engine.from_pretrained(tiny_dir / "full")
    with pytest.raises(error) as info:
        engine.add("bad", prompt, params)
    assert isinstance(info.value, ShardingError) and isinstance(info.value, ValueError)
    assert info.value.code == code and "bad" in str(info.value)
    assert not engine.has_work
    engine.add("ok", [0] * 100, SamplingParams(temperature=0, max_tokens=28))  # exactly fits
    with pytest.raises(DuplicateRequest):
        engine.add("ok", [0, 1])


def test_generate_refuses_a_busy_engine(tiny_dir):
    engine = Engine.from_pretrained(tiny_dir / "full")
    engine.add("running", [0, 5, 6])
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.generate([[0, 7]])


def test_engine_needs_whole_model(tiny_dir):
    with pytest.raises(InvalidLayout, match="whole model"):
        Engine(load_model(tiny_dir / "full", layer_range=(0, 1)))


@pytest.mark.full  # a cold compile of every warm-up shape (minutes); make test compiles rings and engines on fewer shapes
def test_after_the_warm_up_no_batch_compiles_again(tiny_dir):
    # A fresh fast lane once stalled 0.7 s at its first 4 streams: the decode rows are views whose
    # storage offset follows the batch size, and dynamo guarded on it (sharding.stage._own_storage).
    import torch
    from torch._dynamo.utils import counters

    from sharding.stage import warm_up

    torch._dynamo.reset()  # graphs and counters of earlier tests (the recompile limit is per process)
    path = tiny_dir / "full"
    engine = Engine.from_pretrained(path, num_slots=8, compile=True, prefix_cache=True)
    warm_up(engine)
    warmed = counters["stats"]["unique_graphs"]
    assert warmed > 0  # the warm-up compiled: what follows is measured against real graphs
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for rows in (4, 4, 1, 5, 8, 2, 8, 6, 3, 7):
        engine.generate([prompt_ids(path, 5 + r, seed=r) for r in range(rows)], params)
    long = [prompt_ids(path, 40, seed=9)]  # then prompts that continue it: prefix-cache prefills
    engine.generate(long, params)
    engine.generate([long[0] + prompt_ids(path, 3 + r, seed=r) for r in range(4)], params)
    # The end of the context, which the warm-up never reaches: one to three rows filling all but a
    # few positions, then decoding into the last bucket.
    ends = [prompt_ids(path, engine.max_len - 20 - r, seed=20 + r) for r in range(3)]
    for rows in (1, 3):
        engine.generate(ends[:rows], params)
    assert counters["stats"]["unique_graphs"] == warmed


def test_compiled_engine_matches_eager(tiny_dir):
    # Crosses an attention-span bucket (64) and runs batches whose size and prompt widths vary, so
    # the compiled graphs see every shape change an engine makes.
    path = tiny_dir / "full"
    prompts = [prompt_ids(path, n, seed=n) for n in (9, 30, 4)]
    long = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    short = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (20, 6, 12)]

    def run(engine: Engine) -> list[list[list[int]]]:
        return [engine.generate(prompts[:1], long), engine.generate(prompts, short)]

    engine = Engine.from_pretrained(path, num_slots=2, compile=True)
    compiled = run(engine)
    assert compiled == run(Engine.from_pretrained(path, num_slots=2))
    # A decode step enters one compiled region: the forward and the head are one call
    # (Llama.decode_logits), not a compiled forward and then a compiled head.
    engine.add("one", prompts[2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # the prefill
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert [len(o.token_ids) for o in engine.step()] == [1]  # one decode step, one row
    entered = [e.name for e in prof.events() if e.name.startswith("Torch-Compiled Region")]
    assert len(entered) == 1, entered


def logprobs_run(engine, rid: str, ids: list[int], params: SamplingParams) -> tuple[list[int], list]:
    """Drive ``engine`` (``add``/``step``) for one request: its tokens and their ``Logprobs``."""
    engine.add(rid, ids, params)
    tokens, lps = [], []
    while engine.has_work:
        for o in engine.step():
            if o.request_id == rid:
                tokens += o.token_ids
                lps += o.logprobs
    return tokens, lps


def assert_logprobs_are_transformers(path, ids: list[int], tokens: list[int], lps: list, n: int) -> None:
    """Each token's log probability and the ``n`` most likely tokens' are transformers' log-softmax
    of its logits at that position (within 1e-4)."""
    from .conftest import hf_logits

    ref = torch.log_softmax(hf_logits(path, ids + tokens)[len(ids) - 1:-1], dim=-1)  # [T, V]
    assert len(lps) == len(tokens)
    for t, (token, (own, top_ids, top_lps)) in enumerate(zip(tokens, lps, strict=True)):
        assert abs(own - ref[t, token].item()) < 1e-4
        values, order = ref[t].topk(n)
        assert list(top_ids) == order.tolist() and torch.allclose(torch.tensor(top_lps), values, atol=1e-4)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=12, logprobs=5, ignore_eos=True),
                                    SamplingParams(temperature=0.9, top_k=10, repetition_penalty=1.3, seed=2,
                                                   max_tokens=12, logprobs=0, ignore_eos=True)])
def test_logprobs_are_transformers_log_softmax_of_the_raw_logits(batching_checkpoint, params):
    """As vLLM's default ``raw_logprobs``: of the model's logits before any processing or temperature;
    alone and beside a request that asks for none."""
    path = batching_checkpoint
    engine = Engine.from_pretrained(path, num_slots=2)
    ids = prompt_ids(path, 9, seed=4)
    tokens, lps = logprobs_run(engine, "a", ids, params)
    assert_logprobs_are_transformers(path, ids, tokens, lps, params.logprobs)
    engine.add("other", prompt_ids(path, 5), SamplingParams(temperature=0, max_tokens=12))
    again, lps_again = logprobs_run(engine, "b", ids, params)
    assert again == tokens  # and the logprobs within float noise of a batch of two
    assert_logprobs_are_transformers(path, ids, again, lps_again, params.logprobs)


def test_a_request_without_logprobs_gets_none(tiny_dir):
    engine = Engine.from_pretrained(tiny_dir / "full")
    engine.add("r", prompt_ids(tiny_dir / "full", 5), SamplingParams(temperature=0, max_tokens=3))
    assert all(o.logprobs is None for _ in range(3) for o in engine.step())
