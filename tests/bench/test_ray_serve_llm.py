"""The Ray Serve LLM baseline (``bench.ray_serve_llm``) serves the full checkpoint with the standard
lane's engine settings: its greedy completion is transformers' greedy output."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from bench.ray_serve_llm import engine_kwargs
from bench.vllm_serve import CHECKPOINTS, GREEDY_PROMPT, GREEDY_TOKENS
from models import TEST_FULL
from serve.config import StandardLaneConfig
from tests.conftest import shipped


def test_engine_kwargs_are_the_standard_lanes():
    lane = StandardLaneConfig(max_num_seqs=7, kv_cache_memory_bytes=2**25, engine_args={"block_size": 32})
    kw = engine_kwargs(lane, TEST_FULL)
    assert (kw["max_num_seqs"], kw["kv_cache_memory_bytes"], kw["block_size"]) == (7, 2**25, 32)
    # the lane's default "auto" KV budget and context, resolved as the lane resolves them: vLLM takes bytes
    auto = engine_kwargs(StandardLaneConfig(), TEST_FULL)
    assert isinstance(auto["kv_cache_memory_bytes"], int) and auto["kv_cache_memory_bytes"] > 0
    assert auto["max_model_len"] == json.loads((TEST_FULL / "config.json").read_text())["max_position_embeddings"]
    assert (kw["dtype"], kw["enforce_eager"], kw["seed"]) == (lane.dtype, lane.enforce_eager, 0)


@pytest.mark.slow
def test_ray_serve_llm_greedy_matches_transformers(quick_run):
    # `fastmode bench vllm --quick` (in the quick suite) runs Ray Serve LLM and keeps its first answer,
    # a greedy completion (bench.vllm_serve.greedy_completion): one start of the server for both.
    out, _ = quick_run
    got = json.loads((out / "vllm_serve.json").read_text())["greedy"]["ray-serve-llm-full"]
    assert (got["prompt"], got["max_tokens"]) == (GREEDY_PROMPT, GREEDY_TOKENS)
    path = shipped(CHECKPOINTS["ray-full"][1]())
    tok = AutoTokenizer.from_pretrained(path)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(GREEDY_PROMPT, return_tensors="pt").input_ids
    want = hf.generate(ids, max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS, do_sample=False,
                       pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    assert got["text"] == tok.decode(want, skip_special_tokens=True)
