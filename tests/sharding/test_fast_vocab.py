"""A cut vocabulary (the fast lane's ``vocab``: ``StageRunner``'s, ``Engine``'s and ``ShardedModel``'s):
the output is transformers' with every other token suppressed (with ``keep_prompt``: but for each
request's own prompt tokens), in process and on a ring of chips, and logprobs are transformers'
log-softmax over the kept tokens."""

from __future__ import annotations

import pytest
import ray
import torch

from models import TEST_FAST
from sharding.config import ModelConfig
from sharding.draft_vocab import checked_ids, count_tokens, keep_ids, other_ids
from sharding.engine import Engine
from sharding.errors import InvalidLayout
from sharding.pipeline import ShardedModel
from sharding.sampling import SamplingParams
from tests.conftest import shipped

from .conftest import hf_greedy, hf_logits
from .test_engine import logprobs_run
from .test_speculative import PROMPTS

TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=TOKENS)  # stops at the end id, as transformers does


@pytest.fixture(scope="module")
def cut():
    """The test pair's fast model, its prompts, a keep set of 256 ids (its end id, then the most
    frequent of 40 ids in its own greedy answers, then ids in order) and the rest of the vocabulary."""
    from transformers import AutoTokenizer

    path = shipped(TEST_FAST)
    config = ModelConfig.from_pretrained(path)
    prompts = [AutoTokenizer.from_pretrained(path)(p).input_ids for p in PROMPTS]
    answers = [hf_greedy(path, ids, TOKENS) for ids in prompts]
    ranked = [t for t, _ in count_tokens(answers)["counts"]]
    vocab = config.vocab_size
    keep = keep_ids(ranked[:40], 256, vocab, always=config.eos_token_ids)
    kept = set(keep.tolist())
    assert any(t not in kept for a in answers for t in a)  # the cut changes some answers
    return path, prompts, answers, keep, [t for t in range(vocab) if t not in kept]


def test_greedy_is_transformers_with_the_other_tokens_suppressed(cut):
    path, prompts, answers, keep, rest = cut
    engine = Engine.from_pretrained(path, num_slots=4, vocab=keep)
    got = engine.generate(prompts, GREEDY)
    assert got == [hf_greedy(path, ids, TOKENS, suppress_tokens=rest) for ids in prompts]
    assert got != answers and all(t in set(keep.tolist()) for g in got for t in g)


def _keeping_prompts(path, prompts, keep):
    """Transformers' greedy answers, each with every token suppressed but ``keep`` and its own prompt's."""
    kept = set(keep.tolist())
    return [hf_greedy(path, ids, TOKENS, suppress_tokens=other_ids(kept | set(ids), 4096)) for ids in prompts]


@pytest.fixture(scope="module")
def cut_prompts(cut):
    """``cut``'s keep set without any prompt token but the end id (256 ids: the next ones in order
    instead), so that whatever an answer copies from its prompt is outside it."""
    path, prompts, _, keep, _ = cut
    inside = {t for ids in prompts for t in ids} - set(ModelConfig.from_pretrained(path).eos_token_ids)
    ids = [t for t in keep.tolist() if t not in inside]
    ids += [t for t in range(4096) if t not in inside and t not in ids][:len(keep) - len(ids)]
    return path, prompts, checked_ids(sorted(ids), 4096)


def test_keep_prompt_lets_each_request_produce_its_own_prompts_tokens_too(cut_prompts):
    """``keep_prompt``: each row's output is transformers' with only the tokens outside the kept ids and
    outside *its own* prompt suppressed, whatever else is batched with it."""
    path, prompts, keep = cut_prompts
    engine = Engine.from_pretrained(path, num_slots=4, vocab=keep, keep_prompt=True)
    got = engine.generate(prompts, GREEDY)
    assert got == _keeping_prompts(path, prompts, keep)
    kept = set(keep.tolist())
    assert all(t in kept or t in ids for g, ids in zip(got, prompts) for t in g)
    # the prompt rows change some answer: a copied token the plain cut could not produce
    assert got != Engine.from_pretrained(path, num_slots=4, vocab=keep).generate(prompts, GREEDY)
    assert any(t not in kept for g in got for t in g)
    # alone, each answer is the same (rows of one request never reach another's)
    assert [engine.generate([ids], GREEDY)[0] for ids in prompts] == got


def test_compiled_packed_keep_prompt_gives_the_eager_engines_tokens(cut_prompts):
    path, prompts, keep = cut_prompts
    eager = Engine.from_pretrained(path, num_slots=4, vocab=keep, keep_prompt=True)
    compiled = Engine.from_pretrained(path, num_slots=4, vocab=keep, keep_prompt=True, compile=True,
                                      packed_weights=True)
    assert compiled.generate(prompts, GREEDY) == eager.generate(prompts, GREEDY)


def test_compiled_packed_engine_gives_the_eager_engines_tokens(cut):
    """The cut head is what the compiled decode graph and the packed kernel see (cut before both)."""
    path, prompts, _, keep, _ = cut
    eager = Engine.from_pretrained(path, num_slots=4, vocab=keep)
    compiled = Engine.from_pretrained(path, num_slots=4, vocab=keep, compile=True, packed_weights=True)
    assert compiled.executor.runner.model.lm_head.weight.shape[0] == len(keep)
    assert compiled.generate(prompts, GREEDY) == eager.generate(prompts, GREEDY)


def test_logprobs_are_transformers_log_softmax_over_the_kept_tokens(cut):
    path, prompts, _, keep, _ = cut
    engine = Engine.from_pretrained(path, num_slots=2, vocab=keep)
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=12, logprobs=3, ignore_eos=True)
    tokens, lps = logprobs_run(engine, "a", prompts[0], params)
    ids = prompts[0]
    ref = torch.log_softmax(hf_logits(path, ids + tokens)[len(ids) - 1:-1][:, keep], dim=-1)  # [T, len(keep)]
    assert len(lps) == len(tokens) and all(t in set(keep.tolist()) for t in tokens)
    for t, (token, (own, top_ids, top_lps)) in enumerate(zip(tokens, lps, strict=True)):
        assert abs(own - ref[t, keep.tolist().index(token)].item()) < 1e-4
        values, order = ref[t].topk(3)
        assert list(top_ids) == keep[order].tolist()
        assert torch.allclose(torch.tensor(top_lps), values, atol=1e-4)


def test_a_bias_cannot_bring_back_a_cut_token(cut):
    path, prompts, _, keep, rest = cut
    engine = Engine.from_pretrained(path, num_slots=1, vocab=keep)
    out = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True,
                                                       logit_bias={rest[0]: 100.0}))[0]
    assert rest[0] not in out and len(out) == 4


def test_bad_vocabularies_are_typed_errors(cut):
    path, *_ = cut
    for ids, says in (([], "at least one"), ([5, 3], "ascending"), ([3, 3], "ascending"),
                      ([0, 4096], "vocabulary of 4096"), ([-1, 2], "vocabulary of 4096")):
        with pytest.raises(InvalidLayout, match=says):
            Engine.from_pretrained(path, num_slots=1, vocab=ids)
    assert checked_ids(range(3), 4096).tolist() == [0, 1, 2]


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", resources={"chip": 2}, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_a_ring_cuts_on_its_head_chip_alone(cut, ray_cluster):
    """pp=2: the first stage has no head and ignores ``vocab``; the last stage cuts its head."""
    path, prompts, _, keep, rest = cut
    with ShardedModel.from_pretrained(path, pp=2, num_slots=4, vocab=keep.tolist()) as model:
        assert model.vocab == keep.tolist()
        assert model.generate(prompts, GREEDY) == [hf_greedy(path, ids, TOKENS, suppress_tokens=rest)
                                                   for ids in prompts]


def test_a_ring_keeps_each_requests_prompt_tokens_on_its_head_chip(cut_prompts, ray_cluster):
    """pp=2: the prompts travel with the admission to the last stage, which widens its cut head."""
    path, prompts, keep = cut_prompts
    with ShardedModel.from_pretrained(path, pp=2, num_slots=4, vocab=keep.tolist(), keep_prompt=True) as model:
        assert model.generate(prompts, GREEDY) == _keeping_prompts(path, prompts, keep)


def test_a_ring_refuses_a_cut_vocabulary_across_tensor_parallel_ranks(cut, ray_cluster):
    """Refused before any chip is reserved: no placement group appears (the previous test's ring
    may still be giving its chips back, asynchronously)."""
    path, _, _, keep, _ = cut
    before = set(ray.util.placement_group_table())
    with pytest.raises(InvalidLayout, match="tp 1, got tp 2") as info:
        ShardedModel.from_pretrained(path, tp=2, vocab=keep.tolist())
    assert info.value.code == "invalid_layout" and set(ray.util.placement_group_table()) <= before


def test_the_lane_config_becomes_the_rings_ids(tmp_path):
    """``lanes.fast.vocab``: a size takes the folder's most frequent tokens and the end ids; ``auto``
    cuts only a vocabulary of at least 8192 (the test model's is 4096)."""
    import json
    import shutil

    from serve.config import FastLaneConfig
    from serve.lanes.sharded_engine import ring_options

    path = shutil.copytree(shipped(TEST_FAST), tmp_path / "fast")
    (path / "token_counts.json").write_text(json.dumps({"tokens": 9, "counts": [[700, 5], [9, 3], [40, 1]]}))
    assert ModelConfig.from_pretrained(path).eos_token_ids == (1,)
    # the end id, the three counted ids, then ids in order up to a whole block of 16
    assert ring_options(FastLaneConfig(vocab=16), path, tp=1)["vocab"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                           12, 13, 40, 700]
    assert ring_options(FastLaneConfig(vocab=16), path, tp=1)["keep_prompt"] is True
    assert ring_options(FastLaneConfig(vocab=16, vocab_keeps_prompt=False), path, tp=1)["keep_prompt"] is False
    assert ring_options(FastLaneConfig(vocab="auto"), path, tp=1)["vocab"] is None
    assert ring_options(FastLaneConfig(vocab="auto"), path, tp=1)["keep_prompt"] is False
    assert ring_options(FastLaneConfig(), path, tp=1)["vocab"] is None
    assert len(ring_options(FastLaneConfig(vocab=16), path, tp=2)["vocab"]) == 16  # the ring refuses it (above)
