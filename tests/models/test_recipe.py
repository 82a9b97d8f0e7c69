"""The recipe on its tiny configuration: standard checkpoints out, and resumable training."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from models.recipe import corpus
from models.recipe.config import RECIPES, ModelShape, Schedule
from models.recipe.data import batch_at
from models.recipe.export import CHECKPOINT_FILES, new_model
from models.recipe.train import next_token_loss, train


def test_tiny_recipe_writes_standard_checkpoints(tiny_models):
    for name in ("full", "fast"):
        d = tiny_models / name
        for f in CHECKPOINT_FILES:
            assert (d / f).exists(), f
        stats = json.loads((d / "training.json").read_text())
        assert stats["steps"] == getattr(RECIPES["tiny"], "pretrain" if name == "full" else "distill").steps
        assert stats["final_held_out_loss"] > 0
        model = LlamaForCausalLM.from_pretrained(d)
        assert next(model.parameters()).dtype == torch.bfloat16
    full = json.loads((tiny_models / "full" / "training.json").read_text())
    fast = json.loads((tiny_models / "fast" / "training.json").read_text())
    assert fast["parameters"] * 4 <= full["parameters"]
    assert full["config"]["tie_word_embeddings"] is False and fast["config"]["tie_word_embeddings"] is True
    assert "full" in (tiny_models / "README.md").read_text()


def test_held_out_files_never_trained_on():
    files = corpus.list_files()
    train_files, held = corpus.split(files)
    assert held and train_files
    assert not {f.rel_path for f in held} & {f.rel_path for f in train_files}
    assert all(corpus.is_held_out(f.rel_path) for f in held)
    # The rule depends on the path only.
    assert corpus.is_held_out("operator.py") == corpus.is_held_out("operator.py")
    assert corpus.corpus_hash(files) == corpus.corpus_hash(corpus.list_files())


def test_batches_depend_only_on_seed_and_step():
    stream = torch.arange(1000, dtype=torch.int32)
    a = batch_at(stream, 7, 4, 16, seed=1)
    assert torch.equal(a, batch_at(stream, 7, 4, 16, seed=1))
    assert not torch.equal(a, batch_at(stream, 8, 4, 16, seed=1))
    assert torch.equal(a[:, 1:] - a[:, :-1], torch.ones(4, 16, dtype=torch.long))


class Interrupt(Exception):
    pass


def test_interrupted_training_resumes_to_the_same_weights(tmp_path):
    shape = ModelShape(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                       intermediate_size=64, tie_embeddings=True)
    sched = Schedule(steps=6, batch_size=2, seq_len=16, lr=1e-2, warmup=2)
    special = {"bos": 0, "eos": 1, "pad": 2}
    stream = torch.randint(0, 100, (2000,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    windows = stream[:34].long().view(2, 17)

    def fresh():
        torch.manual_seed(0)
        return new_model(shape, vocab_size=100, max_positions=64, special=special)

    common = dict(loss_fn=next_token_loss, stream=stream, eval_windows=windows, sched=sched, seed=3,
                  eval_every=2, checkpoint_every=1)
    whole = fresh()
    train(name="m", model=whole, work_dir=tmp_path / "a", **common)

    calls = {"n": 0}

    def crashing_loss(model, batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise Interrupt
        return next_token_loss(model, batch)

    with pytest.raises(Interrupt):
        train(name="m", model=fresh(), work_dir=tmp_path / "b", **{**common, "loss_fn": crashing_loss})
    resumed = fresh()
    state = train(name="m", model=resumed, work_dir=tmp_path / "b", **common)
    assert state["step"] == 6
    for (n, p), (_, q) in zip(whole.named_parameters(), resumed.named_parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=n)
