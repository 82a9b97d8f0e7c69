"""Tensor parallelism over two gloo ranks on CPU, against transformers; and layouts that cannot split."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from models import TEST_FAST, TEST_FULL
from sharding.config import ModelConfig
from sharding.errors import InvalidLayout
from sharding.model import Llama
from sharding.tp import apply_tp

from . import tp_worker
from .conftest import GQA, SHIPPED, hf_greedy, hf_logits, prompt_ids, resolve

TOL = 1e-4
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def tp2(tiny_dir, tmp_path_factory) -> dict[str, tuple]:
    """``(rank0 results, rank1 results, prompt, path)`` per checkpoint, from one spawn of two
    processes for all checkpoints (each spawn costs seconds of imports)."""
    shipped = {"full": TEST_FULL, "fast": TEST_FAST}
    present = [n for n in GQA if n not in SHIPPED or (shipped[n] / "model.safetensors").exists()]
    paths = {n: resolve(n, tiny_dir) for n in present}
    jobs = [dict(path=str(paths[n]), prompt=prompt_ids(paths[n], 24), new_tokens=NEW_TOKENS) for n in present]
    work = tmp_path_factory.mktemp("tp2")
    mp.spawn(tp_worker.run, args=(2, str(work / "store"), jobs, str(work)), nprocs=2, join=True)
    ranks = [torch.load(work / f"rank{r}.pt") for r in range(2)]
    return {n: (ranks[0][i], ranks[1][i], jobs[i]["prompt"], paths[n]) for i, n in enumerate(present)}


@pytest.fixture(params=GQA)
def result(request, tp2, tiny_dir):
    resolve(request.param, tiny_dir)  # skips a shipped checkpoint that is not there yet
    return tp2[request.param]


def test_tp2_prompt_logits_match_transformers(result):
    rank0, rank1, ids, path = result
    config = ModelConfig.from_pretrained(path)
    assert rank0["shard_shapes"] == {  # really split: half the heads, half the vocabulary rows
        "q_proj": (config.num_heads * config.head_dim // 2, config.hidden_size),
        "o_proj": (config.hidden_size, config.num_heads * config.head_dim // 2),
        "embed_tokens": (config.vocab_size // 2, config.hidden_size),
    }
    ref = hf_logits(path, ids)
    for r in (rank0, rank1):
        assert (r["logits"] - ref).abs().max().item() <= TOL


def test_tp2_greedy_matches_transformers(result):
    rank0, rank1, ids, path = result
    assert rank0["greedy"] == rank1["greedy"] == hf_greedy(path, ids, NEW_TOKENS)


def test_tp2_pipeline_stages_match_whole(result):
    rank0, rank1, _, _ = result
    for r in (rank0, rank1):
        assert (r["pipeline_logits"] - r["logits"]).abs().max().item() <= 1e-5


def test_tp2_ranks_sample_alike(result):
    rank0, rank1, _, _ = result
    assert rank0["sampled"] == rank1["sampled"] and len(rank0["sampled"]) >= 1


@pytest.mark.parametrize("name, tp, what", [
    ("tiny-full", 3, "num_attention_heads=4"),  # 4 heads, 2 kv heads, 192 wide, vocab 600
    ("tiny-full", 8, "num_attention_heads=4"),
    ("tiny-full", 3, "num_key_value_heads=2 .nor is it a multiple"),  # 2 kv heads: neither split nor replicated
])
def test_tp_that_does_not_divide_raises(tiny_dir, name, tp, what):
    config = ModelConfig.from_pretrained(resolve(name, tiny_dir))
    with pytest.raises(InvalidLayout, match=what) as info:
        apply_tp(Llama(config), tp_rank=0, tp_size=tp)
    assert info.value.code == "invalid_layout" and f"tensor parallel size {tp}" in str(info.value)


def test_tp_rank_out_of_range(tiny_dir):
    config = ModelConfig.from_pretrained(resolve("tiny-full", tiny_dir))
    with pytest.raises(InvalidLayout, match="tp_rank"):
        apply_tp(Llama(config), tp_rank=2, tp_size=2)
