"""``bench.speculative_sampling``: samples of fastmode's speculative engine scored under the full model."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_fastmodes_samples_get_a_mean_log_probability_with_its_interval(tmp_path, run_module):
    out = tmp_path / "sampling.json"
    run_module("bench.speculative_sampling", "--kinds", "fastmode", "--samples", 4, "--tokens", 4, "--json", out)
    r = json.loads(out.read_text())["results"]["fastmode"]
    assert r["samples"] == 4 and r["mean_logprob_per_token"] < 0
    assert r["ci95"][0] <= r["mean_logprob_per_token"] <= r["ci95"][1]
