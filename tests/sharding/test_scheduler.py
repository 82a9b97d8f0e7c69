"""``Scheduler``: the batches it builds and how it books tokens, without any model."""

from __future__ import annotations

import torch

from sharding.batch import StepResult
from sharding.config import ModelConfig
from sharding.kv_cache import SlotPool
from sharding.sampling import SamplingParams
from sharding.scheduler import Scheduler

CONFIG = ModelConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4,
                     max_position_embeddings=32, tie_word_embeddings=True, eos_token_ids=(1,))


def test_first_step_prefills_padded_rows_with_their_last_index():
    sched = Scheduler(CONFIG, SlotPool(2), 32)
    sched.add("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))
    sched.add("b", [8], SamplingParams(temperature=1.0, seed=11, max_tokens=4))
    sched.add("c", [9, 9], SamplingParams(temperature=0, max_tokens=4))  # waits: two slots
    batch = sched.schedule()
    assert batch.decode is None and batch.prefill.tokens.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.prefill.positions.tolist() == [[0, 1, 2]] * 2
    assert batch.prefill.slots.tolist() == [0, 1] and batch.prefill.last.tolist() == [2, 0]
    # Each request's parameters travel once, in the step that admits it; rows carry none.
    assert {slot: p.seed for slot, p in batch.admit.items()} == {0: None, 1: 11}
    outs = sched.postprocess(StepResult(prefill=[3, 1]))  # b draws eos
    assert [(o.request_id, o.token_ids, o.finished, o.finish_reason) for o in outs] == [
        ("a", [3], False, None), ("b", [1], True, "stop")]
    batch = sched.schedule()  # c takes b's slot; a decodes its last token at position 3
    assert batch.freed == [1] and batch.prefill.slots.tolist() == [1] and list(batch.admit) == [1]
    assert batch.decode.tokens.tolist() == [[3]] and batch.decode.positions.tolist() == [[3]]
    assert torch.equal(batch.decode.last, torch.tensor([0]))


def test_abort_frees_the_slot_and_tells_the_executor():
    sched = Scheduler(CONFIG, SlotPool(1), 32)
    sched.add("a", [5, 6])
    sched.schedule()
    sched.postprocess(StepResult(prefill=[7]))
    assert sched.abort("a") and sched.slots.num_free == 1 and not sched.has_work
    assert sched.schedule() is None
    sched.add("b", [5])
    assert sched.schedule().freed == [0]  # the executor drops slot 0's generator before reusing it


def test_reserve_for_prompt_logits_returns_its_slot_at_once():
    sched = Scheduler(CONFIG, SlotPool(1), 32)
    assert sched.reserve([4, 5, 6]) == 0 and sched.slots.num_free == 1
