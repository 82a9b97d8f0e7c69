"""The executor's prefix cache: a conversation's next turn reuses its slot, output as transformers'."""

from __future__ import annotations

import pytest

from sharding.engine import Engine
from sharding.prefix_cache import MIN_REUSE_TOKENS, PrefixCache, common_prefix
from sharding.sampling import SamplingParams

from .conftest import hf_greedy, prompt_ids, resolve

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(params=("tiny-full", "full"))
def path(request, tiny_dir):
    return resolve(request.param, tiny_dir)


def test_match_picks_the_longest_prefix_and_keeps_one_token_to_feed():
    cache = PrefixCache()
    cache.park(3, [1, 2, 3, 4])
    cache.park(5, [1, 2, 9])
    assert cache.match([1, 2, 3, 4, 7]) == (3, 4)
    assert cache.match([1, 2, 3, 4]) == (3, 3)  # the last prompt token is fed again, for its logits
    assert cache.match([1, 2, 9, 9]) == (5, 3)
    assert cache.match([8]) == (None, 0)
    assert cache.take(3, reused=4) == 3 and cache.stats() == {"parked": 1, "hits": 1, "reused_tokens": 4}
    cache.park(7, [4])
    assert cache.evict() == 5 and cache.evict() == 7 and len(cache) == 0  # least recently parked first
    assert common_prefix([1, 2], [1, 2, 3]) == 2 and common_prefix([], [1]) == 0


def test_ten_turns_reuse_the_slot_and_match_transformers(path):
    """Each turn's prompt is the last turn's prompt and output plus new tokens: the engine prefills
    only the new part, and every turn's greedy output equals transformers' on the whole history."""
    engine = Engine.from_pretrained(path, num_slots=2, prefix_cache=True)
    history: list[int] = []
    turns = 0
    while turns < 10 and len(history) + 4 + 12 <= engine.max_len:
        kept = len(history)  # the last turn's prompt and output
        history += prompt_ids(path, 20, seed=0) if turns == 0 else prompt_ids(path, 5, seed=turns)[1:]
        before = engine.scheduler.prefix.reused_tokens
        out = engine.generate([history], GREEDY)[0]
        assert out == hf_greedy(path, history, 12), turns
        # all of the last turn but its last output token (sampled, never fed)
        assert engine.scheduler.prefix.reused_tokens - before == max(0, kept - 1), turns
        history += out
        turns += 1
    assert turns >= 6 and engine.scheduler.prefix.hits == turns - 1 and engine.num_unfinished == 0


def test_reuse_beside_fresh_prompts_in_one_batch(path):
    """A continuing prompt (cached prefix, positions from its offset) prefilled in the same step as
    fresh prompts of other lengths: each as transformers has it."""
    engine = Engine.from_pretrained(path, num_slots=3, prefix_cache=True)
    first = prompt_ids(path, 30, seed=1)
    out = engine.generate([first], GREEDY)[0]
    cont = first + out + prompt_ids(path, 4, seed=2)[1:]
    fresh = [prompt_ids(path, n, seed=n) for n in (9, 40)]
    got = engine.generate([cont, *fresh], GREEDY)
    assert got == [hf_greedy(path, p, 12) for p in (cont, *fresh)]
    assert engine.scheduler.prefix.reused_tokens == len(first) + len(out) - 1


@pytest.mark.parametrize("longer", [0, 6])
def test_reuse_beside_a_fresh_prompt_at_least_as_long(path, longer):
    """The same, with a fresh prompt as long as the continuing one or longer: the step is as wide as
    its context, yet one row starts past position 0, so it must not take SDPA's causal path (which
    would let that row's queries see only as many keys as their index)."""
    engine = Engine.from_pretrained(path, num_slots=3, prefix_cache=True)
    first = prompt_ids(path, 30, seed=1)
    out = engine.generate([first], GREEDY)[0]
    cont = first + out + prompt_ids(path, 4, seed=2)[1:]
    fresh = prompt_ids(path, len(cont) + longer, seed=3)
    assert engine.generate([cont, fresh], GREEDY) == [hf_greedy(path, p, 12) for p in (cont, fresh)]
    assert engine.scheduler.prefix.reused_tokens == len(first) + len(out) - 1


def test_parked_slots_count_as_free_and_are_evicted_oldest_first(tiny_dir):
    path = resolve("tiny-full", tiny_dir)
    engine = Engine.from_pretrained(path, num_slots=2, prefix_cache=True)
    a, b, c = (prompt_ids(path, 20, seed=s) for s in (1, 2, 3))
    engine.generate([a], GREEDY)
    engine.generate([b], GREEDY)  # a free slot is left: b takes it, a stays parked
    assert engine.scheduler.prefix.stats()["parked"] == 2 and engine.cache.num_free == 0
    assert engine.generate([c], GREEDY)[0] == hf_greedy(path, c, 12)  # evicts a, the oldest
    assert engine.scheduler.prefix.match(a + [5])[1] < MIN_REUSE_TOKENS
    assert engine.scheduler.prefix.match(b + [5])[1] == len(b)


def test_a_short_shared_start_takes_a_free_slot(tiny_dir):
    path = resolve("tiny-full", tiny_dir)
    engine = Engine.from_pretrained(path, num_slots=2, prefix_cache=True)
    a = prompt_ids(path, 30, seed=1)
    engine.generate([a], GREEDY)
    b = a[:MIN_REUSE_TOKENS - 1] + prompt_ids(path, 10, seed=7)[1:]
    assert engine.generate([b], GREEDY)[0] == hf_greedy(path, b, 12)
    assert engine.scheduler.prefix.hits == 0 and engine.scheduler.prefix.stats()["parked"] == 2


def test_an_aborted_turn_is_reusable(tiny_dir):
    path = resolve("tiny-full", tiny_dir)
    engine = Engine.from_pretrained(path, num_slots=1, prefix_cache=True)
    a = prompt_ids(path, 24, seed=3)
    engine.add("a", a, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    got = []
    for _ in range(4):
        got += [t for o in engine.step() for t in o.token_ids]
    assert engine.abort("a") and engine.num_unfinished == 0
    cont = a + got + [7, 8, 9]
    assert engine.generate([cont], GREEDY)[0] == hf_greedy(path, cont, 12)
    assert engine.scheduler.prefix.reused_tokens == len(a) + len(got) - 1


def test_prompt_logits_with_every_slot_parked(tiny_dir):
    path = resolve("tiny-full", tiny_dir)
    engine = Engine.from_pretrained(path, num_slots=1, prefix_cache=True)
    a = prompt_ids(path, 20, seed=4)
    engine.generate([a], GREEDY)
    assert engine.prompt_logits(a).shape[0] == len(a)  # the parked slot is given up, not overwritten in place
    assert len(engine.scheduler.prefix) == 0
    assert engine.generate([a + [5, 6]], GREEDY)[0] == hf_greedy(path, a + [5, 6], 12)
