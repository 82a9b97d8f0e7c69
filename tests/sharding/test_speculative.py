"""Speculative decoding (``sharding.speculative``): greedy output is the target's greedy output in
transformers, token for token; the rejection rule keeps the target's distribution; ``k`` adapts;
bad input gets typed errors."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from transformers import AutoTokenizer

from models import TEST_FAST, TEST_FULL
from sharding.errors import DuplicateRequest, InvalidLayout, PromptTooLong
from sharding.model import Llama
from sharding.sampling import SamplingParams
from sharding.speculative import K_MAX, DraftMismatch, SpeculativeEngine, accept_sampled, best_k
from sharding.weights import load_model
from tests.conftest import shipped

from .conftest import hf_greedy, hf_processing
from .test_engine import processing_cases

PROMPTS = ["def read_config(path):\n", "import os\nimport sys\n\n\nclass ", "    for i in range(",
           "# Return the n-th Fibonacci number\ndef fib(n):\n"]


@pytest.fixture(scope="module")
def pair():
    full, fast = shipped(TEST_FULL), shipped(TEST_FAST)
    tok = AutoTokenizer.from_pretrained(full)
    return full, fast, [tok(p).input_ids for p in PROMPTS]


@pytest.mark.parametrize("k,adaptive", [(1, False), (4, False), (3, True)])
def test_greedy_is_the_targets_greedy_output_in_transformers(pair, k, adaptive):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=k, adaptive=adaptive)
    ours = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    want = [hf_greedy(full, ids, 40) for ids in prompts]
    assert ours == want
    stats = engine.stats
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted
    assert stats.tokens == sum(len(o) - 1 for o in ours)  # every token after each prefill's first
    assert 1 <= stats.tokens_per_round <= (K_MAX if adaptive else k) + 1  # at most k drafts + 1


def test_greedy_alone_equals_batched_and_joining_midway(pair):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = [engine.generate([p], params)[0] for p in prompts]
    # 4 requests on 2 slots: two wait and join while the others run.
    assert engine.generate(prompts, params) == alone


def test_stops_at_max_tokens_and_eos_like_the_engine(pair):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=4, adaptive=False)
    out = engine.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))
    assert [len(o) for o in out] == [7, 7]
    eos = load_model(full).config.eos_token_ids
    with_eos = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=120))
    for o, ids in zip(with_eos, prompts, strict=True):
        assert o == hf_greedy(full, ids, 120)  # transformers stops after eos too
        assert all(t not in eos for t in o[:-1])


@pytest.mark.parametrize("params", [SamplingParams(temperature=5e-324, max_tokens=24, ignore_eos=True),
                                    SamplingParams(temperature=1.0, top_p=5e-324, max_tokens=24, ignore_eos=True)])
def test_values_too_small_for_float32_decode_the_targets_greedy_output(pair, params):
    """A denormal temperature is greedy; a denormal top_p keeps one token per position, so drafting
    and the rejection rule give the target's greedy output too (it crashed the engine before)."""
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    assert engine.generate(prompts[:2], params) == [hf_greedy(full, ids, 24) for ids in prompts[:2]]


def test_sampled_output_is_seeded_and_within_the_vocabulary(pair):
    full, fast, prompts = pair
    # A fixed k: the draws a seed makes depend on how many drafts each round has (see the module).
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=30, ignore_eos=True)
    a = engine.generate(prompts[:2], params)
    b = engine.generate(prompts[:2], params)
    assert a == b and all(len(o) == 30 for o in a)
    assert all(0 <= t < engine.config.vocab_size for o in a for t in o)
    other = engine.generate(prompts[:2], dataclasses.replace(params, seed=8))
    assert other != a


@pytest.mark.parametrize("k,adaptive", [(3, False), (4, True)])
def test_processed_greedy_is_transformers_generate_on_the_target(pair, k, adaptive):
    """With ``repetition_penalty``, ``logit_bias`` and ``min_tokens`` (each draft position processed
    with the drafts before it) the output is the target's processed greedy output: transformers'
    ``generate`` with the same processors, alone and batched."""
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=k, adaptive=adaptive)
    n, ids = 30, prompts[0]
    free = engine.generate([ids], SamplingParams(temperature=0, max_tokens=n))[0]
    cases = processing_cases(free, n)
    eos = engine.config.eos_token_ids
    want = [hf_greedy(full, ids, n, **hf_processing(p, eos)) for p in cases]
    assert all(w != free for w in want)
    assert [engine.generate([ids], p)[0] for p in cases] == want
    assert engine.generate([ids] * len(cases), cases) == want
    assert engine.stats.accepted > 0


def test_processed_sampling_is_seeded(pair):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    params = SamplingParams(temperature=0.9, top_k=20, min_p=0.02, repetition_penalty=1.2, presence_penalty=0.5,
                            frequency_penalty=0.3, logit_bias={5: 2.0}, min_tokens=10, seed=4, max_tokens=24)
    a = engine.generate(prompts[:2], params)
    assert a == engine.generate(prompts[:2], params) and len(set(a[0])) > 1
    assert a[0] == engine.generate(prompts[:1], params)[0]


@pytest.mark.full  # ~25 s of draws; make test keeps test_rejection_rule_keeps_the_targets_distribution
def test_processed_sampling_keeps_the_targets_processed_distribution(pair):
    """The exact tier samples from the target's processed distribution: the second token (drafted,
    then accepted or corrected by the rule) of 3,072 seeded requests, given the most common first,
    follows transformers' processors (sequence bias, repetition penalty, temperature, top-k) applied
    to the target's logits, and not the unprocessed distribution."""
    from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper)

    from .conftest import hf_logits

    full, fast, prompts = pair
    ids = prompts[0]
    likely = hf_logits(full, ids + [int(hf_logits(full, ids)[-1].argmax())])[-1].topk(3).indices
    bias = {int(likely[2]): 2.5}  # the third most likely second token, made likelier
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=32, k=3, adaptive=False)
    base = dict(temperature=0.8, top_k=12, max_tokens=3, ignore_eos=True)  # a round drafting one token
    outs = []
    for b in range(96):
        outs += engine.generate([ids] * 32, [SamplingParams(**base, repetition_penalty=1.6, logit_bias=bias,
                                                            seed=32 * b + i) for i in range(32)])
    first = max({o[0] for o in outs}, key=[o[0] for o in outs].count)
    second = torch.tensor([o[1] for o in outs if o[0] == first])
    assert len(second) > 1000 and engine.stats.accepted > 0
    seen = torch.bincount(second, minlength=engine.config.vocab_size).float() / len(second)

    context = torch.tensor([ids + [first]])
    logits = hf_logits(full, ids + [first])[-1:].clone()

    def reference(processed: bool) -> torch.Tensor:
        x = logits.clone()
        if processed:
            x = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(context, x)
            x = RepetitionPenaltyLogitsProcessor(1.6)(context, x)
        x = TopKLogitsWarper(12)(None, TemperatureLogitsWarper(0.8)(None, x))
        return torch.softmax(x, dim=-1)[0]

    tv = lambda p: float((seen - p).abs().sum() / 2)  # noqa: E731 - total variation distance
    assert tv(reference(True)) < 0.06 < tv(reference(False))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=20, logprobs=4, ignore_eos=True),
                                    SamplingParams(temperature=0.8, seed=1, max_tokens=20, logprobs=2, ignore_eos=True)])
def test_logprobs_are_the_targets_for_drafted_and_corrected_tokens(pair, params):
    """Each token's log probabilities, whether a draft the target accepted, its correction or the
    prefill's token, are transformers' log-softmax of the full model's logits at that position."""
    from .test_engine import assert_logprobs_are_transformers, logprobs_run

    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    tokens, lps = logprobs_run(engine, "a", prompts[0], params)
    assert engine.stats.accepted > 0 and len(tokens) == 20
    assert_logprobs_are_transformers(full, prompts[0], tokens, lps, params.logprobs)


def test_rejection_rule_keeps_the_targets_distribution():
    """Drafts from q, accepted by the rule: every emitted position follows p (chi-square-free check
    on 40,000 draws of a 5-token vocabulary, 3 drafts)."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 5, generator=g) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(3, 5, generator=g) * 1.5, dim=-1)
    n = 40_000
    first = torch.zeros(5)
    second_after = torch.zeros(5, 5)  # [first token, second token] counts when both are emitted
    for _ in range(n):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(3)])
        a, nxt = accept_sampled(drafts, q, p, g)
        emitted = drafts[:a].tolist() + [nxt]
        first[emitted[0]] += 1
        if len(emitted) > 1 and emitted[0] == 2:
            second_after[2, emitted[1]] += 1
    assert torch.allclose(first / n, p[0], atol=0.01)
    # The second position, given an accepted first draft, follows p[1] (in this test p does not
    # depend on the prefix, as a real target's would).
    row = second_after[2]
    assert row.sum() > 2000
    assert torch.allclose(row / row.sum(), p[1], atol=0.03)


def test_best_k_follows_acceptance_and_costs():
    assert best_k(0.95, t_draft=0.1, t_verify=1.0) == 8  # cheap drafts, nearly always right
    assert best_k(0.1, t_draft=0.5, t_verify=1.0) == 1  # mostly wrong: draft as little as allowed
    assert best_k(0.1, t_draft=0.5, t_verify=1.0, t_plain=1.0) == 0  # ... or not at all, where plain is known
    assert best_k(0.95, t_draft=0.1, t_verify=1.0, t_plain=0.9) == 8
    assert best_k(0.8, t_draft=0.1, t_verify=1.0) > best_k(0.8, t_draft=0.4, t_verify=1.0)


def test_adaptive_decodes_plainly_where_drafts_do_not_pay_and_keeps_probing(pair, monkeypatch):
    """A draft that can propose only 16 tokens the target never picks: ``adaptive`` turns to plain
    decode steps (k = 0), drafts one token every ``PROBE_EVERY`` rounds, and the output is still
    transformers' greedy output of the target. (The engine's clock is one that every timed step
    finds 1 s long, so the choice does not depend on this machine's timings.)"""
    import itertools
    import types

    import sharding.speculative as spec
    from sharding.speculative import PROBE_EVERY

    clock = itertools.count()
    monkeypatch.setattr(spec, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))

    full, fast, prompts = pair
    want = [hf_greedy(full, ids, 60) for ids in prompts]
    seen = {t for o in want for t in o}
    never = torch.tensor([t for t in range(4096) if t not in seen][-16:])
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=2, adaptive=True, draft_vocab=never)
    assert engine.generate(prompts, SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)) == want
    stats = engine.stats
    assert stats.accepted == 0 and engine._t_plain is not None
    # the first two rounds draft k = 2 for each of the 4 sequences (16 drafts); then probes of one each
    probes = (stats.drafted - 16) // len(prompts)
    assert probes >= 1 and stats.rounds >= len(prompts) * PROBE_EVERY * probes  # 15 plain rounds per probe


def test_a_seeded_sampled_request_keeps_k_fixed_and_repeats(pair, monkeypatch):
    """Where ``adaptive`` would decode plainly (the draft proposes only tokens the target never picks,
    every step 1 s long on a fake clock), a seeded sampled request runs at the start ``k`` throughout:
    its tokens do not depend on timings, so the same seed draws them again; another seed does not."""
    import itertools
    import types

    import sharding.speculative as spec

    clock = itertools.count()
    monkeypatch.setattr(spec, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    full, fast, prompts = pair
    seen = {t for ids in prompts for t in hf_greedy(full, ids, 60)}
    never = torch.tensor([t for t in range(4096) if t not in seen][-16:])

    def sample(seed: int) -> list[list[int]]:
        engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=2, adaptive=True, draft_vocab=never)
        out = engine.generate(prompts, SamplingParams(temperature=1.0, seed=seed, max_tokens=40, ignore_eos=True))
        stats = engine.stats  # k = 2 each round but each sequence's last two (never past max_tokens)
        assert stats.drafted >= 2 * (stats.rounds - 2 * len(prompts)) > 0, stats
        return out

    assert sample(1) == sample(1) != sample(2)


def test_bad_input_gets_typed_errors(pair):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=1, k=2)
    engine.add("a", prompts[0], SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(DuplicateRequest):
        engine.add("a", prompts[0], SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(PromptTooLong):
        engine.add("b", prompts[0], SamplingParams(temperature=0, max_tokens=engine.max_len))
    assert engine.abort("a") and not engine.abort("a")
    target = load_model(full)
    other = Llama(dataclasses.replace(target.config, vocab_size=target.config.vocab_size + 1))
    with pytest.raises(DraftMismatch):
        SpeculativeEngine(target, other)
    with pytest.raises(InvalidLayout):
        SpeculativeEngine(target, load_model(fast), k=99)


def test_abort_frees_the_slot_for_the_next_request(pair):
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=1, k=2, adaptive=False)
    engine.add("a", prompts[0], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    engine.add("b", prompts[1], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.abort("a")
    got = []
    while engine.has_work:
        got += [t for o in engine.step() if o.request_id == "b" for t in o.token_ids]
    assert got == hf_greedy(full, prompts[1], 5)


def _turns(engine: SpeculativeEngine, first: list[int], turns: int, extra: list[list[int]]) -> tuple[list, list]:
    """A conversation: each turn's prompt is the last prompt, its output and new input. Returns each
    turn's output and the cached prompt tokens reported on its first output."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt, outs, cached = first, [], []
    for i in range(turns):
        engine.add(f"t{i}", prompt, params)
        out, hit = [], None
        while engine.has_work:
            for o in engine.step():
                out += o.token_ids
                hit = o.cached if hit is None else hit
        outs.append(out)
        cached.append(hit)
        prompt = prompt + out + extra[i]
    return outs, cached


def test_prefix_cache_reuses_a_conversations_history_in_both_models(pair):
    full, fast, prompts = pair
    extra = [prompts[(i + 1) % len(prompts)] for i in range(4)]
    cold = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    warm = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, prefix_cache=True)
    want, none = _turns(cold, prompts[3], 4, extra)
    got, cached = _turns(warm, prompts[3], 4, extra)
    assert got == want  # the draft's and the target's kept keys and values are the right ones
    assert none == [0] * 4 and cached[0] == 0
    prompt = prompts[3]
    for i in range(1, 4):  # every later turn reuses the target's history but the last output token (never fed)
        n = len(prompt) + len(want[i - 1])
        assert cached[i] == n - 1
        prompt = prompt + want[i - 1] + extra[i - 1]
    last = prompt
    assert want[3] == hf_greedy(full, last, 12)
    assert warm.prefix_stats()["hits"] == 3
    # An abort parks what both caches hold, and a later prompt continuing it still comes out right.
    warm.add("x", last, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(3):
        warm.step()
    assert warm.abort("x")
    assert warm.generate([last + [5, 6]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)) == [
        hf_greedy(full, last + [5, 6], 8)]


def test_a_continuing_prompt_prefilled_beside_a_longer_fresh_one_is_the_targets_greedy(pair):
    """A prefix-cache hit admitted in the same step as a fresh prompt at least as long: the hit's row
    starts past position 0 in a step as wide as its context, which sharding.stage's causal path
    must not take (on it, that row's queries would see only as many keys as their index)."""
    full, fast, prompts = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, prefix_cache=True)
    first = prompts[3] + prompts[0]
    out = engine.generate([first], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    cont = first + out + prompts[2]
    fresh = (prompts[1] * 8)[:len(cont) + 2]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert engine.generate([cont, fresh], params) == [hf_greedy(full, p, 12) for p in (cont, fresh)]
    assert engine.prefix_stats()["reused_tokens"] == len(first) + len(out) - 1


def _draft_keys(engine: SpeculativeEngine, slot: int, n: int) -> list[torch.Tensor]:
    return [k[slot, :n].clone() for k in engine.draft.cache.k]


def test_a_turn_that_ended_in_plain_rounds_reuses_the_targets_history_and_catches_the_draft_up(pair):
    """Plain rounds (k = 0, adaptive's choice when drafts do not pay) feed the target alone: the
    draft's cache falls behind. The next turn still skips all the target held, and the draft
    prefills what it missed: its cache then holds what a fresh prefill of the prompt writes."""
    full, fast, prompts = pair
    warm = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=0, adaptive=False, prefix_cache=True)
    first = warm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    history = prompts[0] + first + prompts[1]
    warm.k = 3  # the next turn drafts again
    got, hit = _turns(warm, history, 1, [[]])
    assert hit == [len(prompts[0]) + 20 - 1]  # all the target held, not only what the draft had seen
    assert got == [hf_greedy(full, history, 12)]
    cold = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, prefix_cache=True)
    assert _turns(cold, history, 1, [[]]) == (got, [0])
    (w_slot,), (c_slot,) = warm.prefix._slots, cold.prefix._slots  # each engine's one conversation, parked
    for w, c in zip(_draft_keys(warm, w_slot, len(history)), _draft_keys(cold, c_slot, len(history))):
        torch.testing.assert_close(w, c, atol=1e-4, rtol=1e-4)


@pytest.mark.full  # a cold compile of every warm-up shape (minutes); make test compiles rings and engines on fewer shapes
@pytest.mark.parametrize("compile_regions", [False, True], ids=["whole", "regions"])
def test_after_the_warm_up_no_batch_compiles_again(tiny_dir, compile_regions):
    # The exact lane warms its engine up at start; a compile after it would stall a user's request.
    from torch._dynamo.utils import counters

    from .conftest import prompt_ids

    torch._dynamo.reset()
    full, fast = tiny_dir / "full", tiny_dir / "fast"
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=3, adaptive=False, compile=True,
                                               compile_regions=compile_regions, prefix_cache=True)
    engine.warm_up()
    warmed = counters["stats"]["unique_graphs"]
    assert warmed > 0 and engine.stats.rounds == 0 and not engine.prefix and engine.k == 3
    # One row across attention-span buckets: its draft steps take columns of the [1, k] drafts, views
    # whose stride follows k (sharding.stage._own_storage).
    engine.generate([prompt_ids(full, 11, seed=3)], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for rows in (4, 1, 3, 2, 4):
        engine.generate([prompt_ids(full, 5 + r, seed=r) for r in range(rows)], params)
    long = [prompt_ids(full, 40, seed=9)]
    engine.generate(long, params)
    engine.generate([long[0] + prompt_ids(full, 3 + r, seed=r) for r in range(3)], params)
    engine.generate([prompt_ids(full, 6, seed=1)] * 2, SamplingParams(temperature=0.9, seed=1, max_tokens=9))
    assert counters["stats"]["unique_graphs"] == warmed


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.full)])
def test_the_warm_up_visits_a_few_spans_and_the_rest_compile_nothing(tmp_path, monkeypatch, caplog, backend):
    """The warm-up's sweep visits the first spans and the last (``sharding.stage.sweep_spans``), not
    every bucket of the context; requests then reach the spans between, which must find their graphs.
    Each compiled model counts its own graphs against Dynamo's recompile limit, past which Dynamo runs
    it eager without failing, so the warm-up must stay within it (``sharding.stage.RECOMPILE_LIMIT``).
    ``eager``: Dynamo's guards alone (seconds); ``inductor``: its own guards too (a cold compile)."""
    import logging

    from torch._dynamo.utils import counters

    from sharding import stage

    from .conftest import save_random_llama

    monkeypatch.setattr(stage, "BACKEND", backend)
    torch._dynamo.reset()
    context = 5 * stage.SPAN_BUCKET
    full = save_random_llama(tmp_path / "full", max_position_embeddings=context)
    fast = save_random_llama(tmp_path / "fast", max_position_embeddings=context, num_hidden_layers=1)
    with torch._dynamo.config.patch(recompile_limit=8), caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        # Dynamo's default limit, whatever ran before: compiling raises it
        engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=True, compile=True,
                                                   prefix_cache=True)
        visited = stage.sweep_spans(engine.target.cache.max_len)
        assert len(visited) == 4 and visited[-1] == context  # 64, 128, 192 and 320: 256 skipped
        engine.warm_up()
        warmed = counters["stats"]["unique_graphs"]
        g = torch.Generator().manual_seed(0)
        ids = lambda n: [0] + torch.randint(3, 320, (n - 1,), generator=g).tolist()  # noqa: E731
        greedy = SamplingParams(temperature=0, max_tokens=context - 40, ignore_eos=True)
        engine.generate([ids(11)], greedy)  # one row decoding through every span
        engine.generate([ids(7), ids(30)], greedy)  # two rows, the same
        long = ids(3 * stage.SPAN_BUCKET + 10)  # a prefill whose span is the skipped one, then a turn after it
        engine.generate([long], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        engine.generate([long + ids(5)[1:]], SamplingParams(temperature=0.8, seed=1, max_tokens=20))
    assert counters["stats"]["unique_graphs"] == warmed
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]


def test_compiled_draft_and_target_in_one_process_keep_their_own_outputs(tiny_dir, monkeypatch):
    """Compiled models' guards skip their modules (``sharding.stage.compile_method``), so each model's
    methods need a code object of their own: a draft (here with a pruned head), its target and a
    second target engine, compiled in one process and called in turns, each give its eager output."""
    from sharding import stage
    from sharding.engine import Engine

    monkeypatch.setattr(stage, "BACKEND", "eager")  # Dynamo's guards and caches, without inductor's build
    torch._dynamo.reset()
    full, fast = tiny_dir / "full", tiny_dir / "fast"
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eager = {p: Engine.from_pretrained(p, num_slots=2).generate(prompts, params) for p in (full, fast)}
    assert eager[full] != eager[fast]
    compiled = {p: Engine.from_pretrained(p, num_slots=2, compile=True) for p in (full, fast)}
    keep = torch.arange(0, load_model(fast).config.vocab_size, 2)  # a pruned draft head: every other id
    spec = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, compile=True,
                                             draft_vocab=keep)
    for _ in range(2):
        for p in (full, fast):
            assert compiled[p].generate(prompts, params) == eager[p]
        assert spec.generate(prompts, params) == eager[full]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_compile_regions_trace_one_layer_for_all_and_decode_transformers_greedy(tmp_path, monkeypatch, family):
    """With ``compile_regions`` (``sharding.stage.compile_forward``) each graph calls one traced region
    for its layers, and the engine's greedy tokens are transformers'. Gemma 3's sliding and full
    layers run the same code on different masks and rotary tables (arguments), so they share the
    region too, except in a fresh prompt's prefill, where a full layer's mask is ``None`` (SDPA's
    causal path) and Dynamo traces that layer inline. A recording backend: Dynamo's side, without
    inductor's build (``test_packed`` runs inductor's)."""
    from transformers import AutoModelForCausalLM

    from sharding import stage

    from .families import save_family

    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(stage, "BACKEND", record)
    torch._dynamo.reset()
    path = save_family(family, tmp_path / family, num_hidden_layers=3)
    engine = SpeculativeEngine(load_model(path), load_model(path), num_slots=2, k=2, adaptive=False,
                               compile=True, compile_regions=True)
    prompts = [[0, 5, 9, 33, 17, 250, 81], [0, 44, 12]]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, pad_token_id=2)
        assert out == ref[0, len(prompt):].tolist()
    calls = [[n.args[0].target for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
             for gm in graphs]
    assert calls and all(len(set(c)) == 1 for c in calls)  # one region per graph
    if family == "llama":
        assert all(len(c) == 3 for c in calls)  # every layer a call of it
    else:  # sliding, full, sliding: the full layer inline in the fresh prefills, a call everywhere else
        assert sorted({len(c) for c in calls}) == [2, 3]


def test_compile_regions_refuse_a_tensor_parallel_rank():
    from sharding import stage

    model = types.SimpleNamespace(modules=lambda: [types.SimpleNamespace(tp_size=2)])
    with pytest.raises(InvalidLayout, match="tensor-parallel"):
        stage.mark_layer_regions(model)
