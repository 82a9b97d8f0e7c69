"""``fastmode bench speculative``: fastmode's executor plain and speculative, in a tiny setting; greedy
speculative decoding must give the plain engine's output token for token."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_ours_plain_fixed_and_adaptive(tmp_path, run_module):
    out = tmp_path / "speculative.json"
    run_module("bench.speculative", "--only-ours", "--no-packed", "--no-compile", "--ks", 2, "--tokens", 12,
               "--prompts", 1, "--repeats", 1, "--json", out)
    doc = json.loads(out.read_text())
    assert doc["settings"]["compile"] is False
    results = doc["results"]
    assert [(r["worker"], "error" in r) for r in results] == [("ours:0:fixed:0", False), ("ours:2:fixed:0", False),
                                                             ("ours:2:adaptive:0", False)]
    for r in results:
        assert r["identical_to_plain"] and r["tokens_per_s_p50"] > 0
    for r in results[1:]:
        assert 0 <= r["acceptance"] <= 1 and 1 <= r["tokens_per_verify"] <= 3


@pytest.mark.slow
def test_a_pair_by_path_with_a_pruned_draft_head(tmp_path, run_module):
    """``--full/--fast`` name the pair (here the test pair's folders, the fast one given token counts);
    ``--draft-vocab`` adds a run whose draft proposes only that many tokens: the same greedy output."""
    import shutil

    from models import TEST_FAST, TEST_FULL
    from sharding.draft_vocab import TOKEN_COUNTS

    fast = shutil.copytree(TEST_FAST, tmp_path / "fast")
    (fast / TOKEN_COUNTS).write_text(json.dumps({"tokens": 3, "counts": [[198, 2], [220, 1]]}))
    out = tmp_path / "speculative.json"
    run_module("bench.speculative", "--only-ours", "--no-packed", "--no-compile", "--ks", 2, "--tokens", 12,
               "--prompts", 1, "--repeats", 1, "--full", TEST_FULL, "--fast", fast, "--draft-vocab", 64,
               "--json", out)
    results = json.loads(out.read_text())["results"]
    assert [r["worker"] for r in results] == ["ours:0:fixed:0", "ours:2:fixed:0", "ours:2:adaptive:0", "ours:2:fixed:64",
                                                "ours:2:adaptive:64"]
    assert all("error" not in r and r["identical_to_plain"] for r in results)
    assert results[-1]["draft_vocab"] == results[-2]["draft_vocab"] == 64 and results[1]["draft_vocab"] is None
