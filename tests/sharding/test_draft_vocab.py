"""A pruned draft head (``sharding.draft_vocab``): which ids it keeps, its logits, and the exact tier's
output unchanged with it: greedy token for token transformers' greedy output of the target, sampled
the target's distribution (the rejection rule with a draft that cannot propose some tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from models import TEST_FAST, TEST_FULL
from sharding.draft_vocab import (TOKEN_COUNTS, DraftVocabUnavailable, count_tokens, expand, keep_ids, prune_head,
                                  ranked_ids)
from sharding.errors import InvalidLayout
from sharding.sampling import SamplingParams
from sharding.speculative import SpeculativeEngine, accept_sampled
from sharding.weights import load_model
from tests.conftest import shipped

from .conftest import hf_greedy
from .test_speculative import PROMPTS

TOKENS = 32


@pytest.fixture(scope="module")
def pair():
    """The test pair, its prompts, and a keep set of 256 ids: the most frequent in the target's own
    greedy answers to them, so that many drafts can be accepted and some target tokens lie outside."""
    full, fast = shipped(TEST_FULL), shipped(TEST_FAST)
    tok = AutoTokenizer.from_pretrained(full)
    prompts = [tok(p).input_ids for p in PROMPTS]
    want = [hf_greedy(full, ids, TOKENS) for ids in prompts]
    ranked = [t for t, _ in count_tokens(want)["counts"]]
    vocab = json.loads((full / "config.json").read_text())["vocab_size"]
    keep = keep_ids(ranked[:40], 256, vocab)
    assert any(t not in set(keep.tolist()) for o in want for t in o)  # the rejection path is exercised
    return full, fast, prompts, want, keep


def test_keep_ids_takes_end_ids_then_the_ranking_then_ids_in_order():
    keep = keep_ids([7, 3, 9, 3], 5, 100, always=[50])
    assert keep.tolist() == sorted({50, 7, 3, 9, 0, 1, 2, 4, 5, 6, 8, 10, 11, 12, 13, 14})  # 16: whole blocks
    assert keep_ids(list(range(99, -1, -1)), 16, 100).tolist() == list(range(84, 100))
    assert len(keep_ids([], 1000, 40)) == 40  # never more than the vocabulary
    with pytest.raises(InvalidLayout, match="positive"):
        keep_ids([1], 0, 100)
    with pytest.raises(InvalidLayout, match="outside the draft's vocabulary"):
        keep_ids([100], 16, 100)


def test_count_tokens_ranks_by_frequency_then_id():
    counts = count_tokens([[5, 3, 5], [3, 9, 5]])
    assert counts == {"tokens": 6, "counts": [[5, 3], [3, 2], [9, 1]]}


def test_a_pruned_head_gives_the_whole_heads_logits_at_its_ids(pair):
    _, fast, *_ = pair
    whole, pruned = load_model(fast), load_model(fast)
    keep = torch.tensor([0, 3, 17, 400, 4095])
    prune_head(pruned, keep)
    h = torch.randn(2, 3, whole.config.hidden_size)
    logits = pruned.compute_logits(h)
    torch.testing.assert_close(logits, whole.compute_logits(h)[..., keep], rtol=1e-5, atol=1e-5)
    full = expand(logits, keep, whole.config.vocab_size)
    assert torch.equal(full[..., keep], logits)
    assert torch.isinf(full).sum() == 2 * 3 * (whole.config.vocab_size - len(keep))
    # the tied embedding keeps its whole table
    assert pruned.model.embed_tokens.weight.shape[0] == whole.config.vocab_size


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_with_a_pruned_draft_is_the_targets_greedy_output_in_transformers(pair, k):
    full, fast, prompts, want, keep = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=4, k=k, adaptive=False, draft_vocab=keep)
    assert engine.generate(prompts, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)) == want
    assert 0 < engine.stats.accepted < engine.stats.drafted


def test_processed_greedy_with_a_pruned_draft_is_the_unpruned_engines(pair):
    """Parameters whose processing reads the history (penalties, a bias on a token outside the kept
    ids) go through the whole vocabulary in both models: the same tokens as the whole draft head's."""
    full, fast, prompts, _, keep = pair
    outside = next(t for t in range(100, 4096) if t not in set(keep.tolist()))
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, repetition_penalty=1.3,
                            logit_bias={outside: 3.0})
    whole = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False)
    pruned = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, draft_vocab=keep)
    assert pruned.generate(prompts, params) == whole.generate(prompts, params)


def test_sampled_rule_keeps_the_targets_distribution_when_the_draft_cannot_propose_some_tokens():
    """Drafts from a q that is zero on two of five tokens (what a pruned head gives): every emitted
    first token still follows p, the two included (40,000 draws, 3 drafts)."""
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(4, 5, generator=g), dim=-1)
    q = torch.softmax(expand(torch.randn(3, 3, generator=g) * 1.5, torch.tensor([0, 2, 3]), 5), dim=-1)
    assert (q[:, [1, 4]] == 0).all()
    n, first = 40_000, torch.zeros(5)
    for _ in range(n):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(3)])
        a, nxt = accept_sampled(drafts, q, p, g)
        first[(drafts[:a].tolist() + [nxt])[0]] += 1
    assert torch.allclose(first / n, p[0], atol=0.01)


def test_sampled_with_a_pruned_draft_is_seeded_and_in_the_vocabulary(pair):
    full, fast, prompts, _, keep = pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, draft_vocab=keep)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=TOKENS, ignore_eos=True)
    a = engine.generate(prompts[:2], params)
    assert a == engine.generate(prompts[:2], params)
    assert all(0 <= t < engine.config.vocab_size for o in a for t in o)
    assert engine.stats.drafted > 0 and len(set(a[0])) > 1


def test_draft_vocab_size_reads_the_fast_models_token_counts(pair, tmp_path):
    import shutil

    full, fast, prompts, want, _ = pair
    draft = Path(shutil.copytree(fast, tmp_path / "fast"))
    with pytest.raises(DraftVocabUnavailable, match="token_counts.json does not exist"):
        SpeculativeEngine.from_pretrained(full, draft, draft_vocab_size=256)
    (draft / TOKEN_COUNTS).write_text("{}")
    with pytest.raises(DraftVocabUnavailable, match="not a token-counts file"):
        ranked_ids(draft)
    (draft / TOKEN_COUNTS).write_text(json.dumps(count_tokens(want)))
    engine = SpeculativeEngine.from_pretrained(full, draft, num_slots=4, k=2, adaptive=False, draft_vocab_size=100)
    assert len(engine.draft_vocab) == 112  # rounded up to whole 16-row blocks
    assert set(engine.config.eos_token_ids) <= set(engine.draft_vocab.tolist())
    assert engine.generate(prompts, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)) == want


def test_bad_draft_vocab_is_a_typed_error(pair):
    full, fast, *_ = pair
    for bad in ([4096], [3, 3], []):
        with pytest.raises(InvalidLayout, match="distinct token ids"):
            SpeculativeEngine.from_pretrained(full, fast, draft_vocab=torch.tensor(bad, dtype=torch.long))


def test_auto_prunes_only_a_large_vocabulary_with_counts(tmp_path):
    from sharding.draft_vocab import AUTO_SIZE, resolve

    assert resolve("auto", tmp_path, 49152) is None  # no counts: the whole vocabulary
    (tmp_path / TOKEN_COUNTS).write_text('{"tokens": 1, "counts": [[5, 1]]}')
    assert resolve("auto", tmp_path, 49152) == AUTO_SIZE
    assert resolve("auto", tmp_path, 4096) is None  # too small a vocabulary to gain from it
    assert resolve(1000, tmp_path, 4096) == 1000 and resolve(None, tmp_path, 49152) is None
