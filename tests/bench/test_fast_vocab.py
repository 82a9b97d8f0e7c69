"""``bench.fast_vocab``: the fast lane's ring with a cut head and with other slot counts, timed in
alternated rounds (eager, on the test pair's fast model given token counts)."""

from __future__ import annotations

import json
import shutil

import pytest

from bench import fast_vocab, pair
from models import TEST_FAST
from tests.conftest import shipped


@pytest.mark.slow
def test_cut_and_whole_heads_are_timed_in_alternated_rounds(tmp_path, monkeypatch):
    fast = shutil.copytree(shipped(TEST_FAST), tmp_path / "fast")
    (fast / "token_counts.json").write_text(json.dumps({"tokens": 3, "counts": [[300, 2], [301, 1]]}))
    monkeypatch.setattr(pair, "fast", lambda: fast)
    out = tmp_path / "vocab.json"
    assert fast_vocab.main(["--vocab", "none,256", "--slots", "2", "--tokens", "4", "--rounds", "2",
                            "--keep-prompt", "on,off", "--no-compile", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    # the whole head once (nothing to keep), the cut one with and without each request's prompt tokens
    assert [(r["head_rows"], r["keeps_prompt"], r["slots"]) for r in doc["results"]] == [
        ("whole", False, 2), (256, True, 2), (256, False, 2)]
    assert [(r["vocab"], r["slots"]) for r in doc["runs"]] == [(None, 2), (None, 2), (256, 2), (256, 2),
                                                               (256, 2), (256, 2)]
    assert all(r["one_stream_tokens_per_s"] > 0 and r["aggregate_tokens_per_s"] > 0 for r in doc["runs"])
    assert doc["results"][0]["one_stream_vs_first"] == doc["results"][0]["aggregate_vs_first"] == 1.0


@pytest.mark.slow
def test_other_fast_models_are_configurations_of_the_same_run(tmp_path):
    other = shutil.copytree(shipped(TEST_FAST), tmp_path / "other")
    out = tmp_path / "models.json"
    assert fast_vocab.main(["--fast", f"{shipped(TEST_FAST)},{other}", "--vocab", "none", "--slots", "2",
                            "--tokens", "4", "--rounds", "1", "--no-compile", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["model"] for r in doc["results"]] == [str(shipped(TEST_FAST)), str(other)]
    assert doc["results"][1]["one_stream_vs_first"] > 0
    with pytest.raises(SystemExit):
        fast_vocab.main(["--fast", str(tmp_path / "missing"), "--rounds", "1"])
    with pytest.raises(SystemExit):
        fast_vocab.main(["--keep-prompt", "maybe", "--rounds", "1"])
