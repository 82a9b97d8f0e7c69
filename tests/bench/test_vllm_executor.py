"""``bench.vllm_executor``: a vLLM lane's engine in process, per-user speed and CPU per token."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_one_stream_on_the_priority_lanes_engine(run_module):
    doc = json.loads(run_module("bench.vllm_executor", "--lane", "priority", "--executor", "uni", "--streams", 1,
                                "--tokens", 8, "--rounds", 2).splitlines()[-1])
    assert doc["settings"]["executor"] == "uni" and doc["output_tokens"] == 2 * 8
    assert doc["per_user_tokens_per_s_p50"] > 0 and doc["aggregate_tokens_per_s"] > 0 and doc["cpu_ms_per_token"] > 0
