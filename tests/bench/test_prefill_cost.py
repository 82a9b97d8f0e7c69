"""``bench.prefill_cost``: a full-model lane's engine in process, first tokens against prompt length,
a replayed conversation and a cached history, in a tiny setting."""

from __future__ import annotations

import json
import math

import pytest


@pytest.mark.slow
def test_lengths_replay_and_history(tmp_path, run_module):
    out = tmp_path / "prefill.json"
    run_module("bench.prefill_cost", "--lane", "standard", "--lengths", "4,32", "--rounds", 1, "--replay", 1,
               "--history", "0,32", "--json", out)
    doc = json.loads(out.read_text())
    assert set(doc["ttft_ms_median"]) == {"4", "32"} and all(t > 0 for t in doc["ttft_ms_median"].values())
    assert math.isfinite(doc["ms_per_prompt_token"])
    turns = doc["replay"]
    assert turns["conversations"] == 1 and len(turns["ttft_ms_per_turn"]) == len(turns["prefilled_tokens_per_turn"]) == 20
    assert all(n >= 1 for n in turns["prefilled_tokens_per_turn"])
    after = doc["after_history"]
    # every new token is prefilled; of a history the prefix cache held, at most what it did not
    assert all(after["new_tokens"] <= n <= after["new_tokens"] + int(h) + 1 for h, n in after["prefilled_median"].items())
