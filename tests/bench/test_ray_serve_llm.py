"""The Ray Serve LLM baseline (``bench.ray_serve_llm``) serves the full checkpoint with the standard
lane's engine settings: its greedy completion is transformers' greedy output."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from bench.ray_serve_llm import engine_kwargs
from bench.vllm_serve import CHECKPOINTS, vllm_server
from serve.config import StandardLaneConfig
from tests.conftest import shipped

PROMPT, TOKENS = "def fibonacci(n):\n", 12


def test_engine_kwargs_are_the_standard_lanes():
    lane = StandardLaneConfig(max_num_seqs=7, kv_cache_memory_bytes=2**25, engine_args={"block_size": 32})
    kw = engine_kwargs(lane)
    assert (kw["max_num_seqs"], kw["kv_cache_memory_bytes"], kw["block_size"]) == (7, 2**25, 32)
    assert (kw["dtype"], kw["enforce_eager"], kw["seed"]) == (lane.dtype, lane.enforce_eager, 0)


@pytest.mark.slow
def test_ray_serve_llm_greedy_matches_transformers(tmp_path):
    model_id, path = CHECKPOINTS["ray-full"]
    path = shipped(path)
    tok = AutoTokenizer.from_pretrained(path)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    want = hf.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                       pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    log = tmp_path / "ray_serve_llm.log"
    with vllm_server("ray-full", log) as url:
        r = httpx.post(url + "/v1/completions", timeout=300,
                       json={"model": model_id, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0,
                             "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True)
