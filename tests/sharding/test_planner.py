"""The planner: valid layouts, fit rules, predictions that follow the model, chip spec files, CLI."""

from __future__ import annotations

import json

import pytest

from models import TEST_FAST, TEST_FULL
from sharding.chips import PRESETS, ChipSpec, ChipSpecError, load_chip
from sharding.planner import Footprint, PlanError, auto_layout, main, plan, predict, valid_layouts
from tests.conftest import shipped

# Llama-3.2-1B's shape (config.json fields), for planning a real model without its weights.
LLAMA_1B = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}
SMALL = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
         "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def tiny_chip(**kw) -> ChipSpec:
    base = dict(name="t", memory_bytes=1e9, fast_memory_bytes=1e6, memory_bandwidth=1e10,
                fast_memory_bandwidth=1e11, link_bandwidth=1e9, link_latency=1e-4,
                link_latency_collective=1e-5, layer_overhead=1e-5)
    return ChipSpec(**{**base, **kw})


@pytest.mark.parametrize("change", [{}, {"num_key_value_heads": 1}, {"num_hidden_layers": 3},
                                    {"num_attention_heads": 6, "head_dim": 16}])
def test_valid_layouts_are_the_layouts_the_executor_accepts(change):
    """The planner's rule is the executor's: every (tp, pp) that stage_layers accepts, and only those."""
    from sharding.config import ModelConfig
    from sharding.errors import InvalidLayout
    from sharding.placement import stage_layers

    raw = {**SMALL, **change}
    config = ModelConfig.from_dict(raw)

    def runs(tp: int, pp: int) -> bool:
        try:
            stage_layers(config, tp, pp)
            return True
        except InvalidLayout:
            return False

    accepted = [(tp, pp) for tp in range(1, 9) for pp in range(1, 9) if tp * pp <= 8 and runs(tp, pp)]
    assert sorted(valid_layouts(Footprint.from_config(raw), 8)) == accepted
    assert valid_layouts(Footprint.from_config(raw), 1) == [(1, 1)]


def test_parameter_count_matches_the_shipped_checkpoint():
    from transformers import LlamaForCausalLM

    from models.recipe.export import count_parameters

    path = shipped(TEST_FULL)
    cfg = json.loads((path / "config.json").read_text())
    fp = Footprint.from_config(cfg)
    counted = fp.layers * fp.layer_params(1) + 2 * fp.vocab * fp.hidden + fp.hidden  # untied
    assert counted == count_parameters(LlamaForCausalLM.from_pretrained(path))


def test_prefers_layouts_that_fit_fast_memory():
    # Fast memory for 60% of the whole model: 1x1 does not fit, a split does, and wins.
    fp = Footprint.from_config(SMALL)
    whole = predict(fp, tiny_chip(), 1, 1).max_chip_bytes
    best, cands = plan(SMALL, tiny_chip(fast_memory_bytes=0.6 * whole), chips=8)
    assert best.fits_fast_memory and best.chips > 1
    assert not next(c for c in cands if (c.tp, c.pp) == (1, 1)).fits_fast_memory


def test_more_bandwidth_predicts_more_tokens_per_second():
    fp = Footprint.from_config(LLAMA_1B)
    slow = predict(fp, tiny_chip(memory_bandwidth=1e11, memory_bytes=1e12), 1, 1)
    fast = predict(fp, tiny_chip(memory_bandwidth=1e12, memory_bytes=1e12), 1, 1)
    assert fast.tokens_per_s > slow.tokens_per_s
    hops = predict(fp, tiny_chip(memory_bytes=1e12), 1, 4)
    # The ring: three stage hops and the token back to the head; activations cross the three.
    assert hops.hop_s == pytest.approx(4 * 1e-4 + 3 * 2048 * 2 / 1e9)
    assert predict(fp, tiny_chip(memory_bytes=1e12), 1, 1).hop_s == 0  # one stage samples itself


def test_real_model_on_presets():
    best, _ = plan(LLAMA_1B, PRESETS["h100"], chips=8)
    assert best.fits_memory and best.tokens_per_s > 100
    wse, _ = plan(LLAMA_1B, PRESETS["wse-3"], chips=1)
    assert wse.fits_fast_memory  # 2.5 GB of weights live in 44 GB of SRAM


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(PlanError, match="no layout"):
        plan(LLAMA_1B, tiny_chip(memory_bytes=1e6), chips=2)
    with pytest.raises(PlanError):
        plan(SMALL, tiny_chip(), chips=0)


def test_chip_spec_files(tmp_path):
    spec = tiny_chip().to_dict()
    (tmp_path / "a.json").write_text(json.dumps(spec))
    assert load_chip(str(tmp_path / "a.json")) == tiny_chip()
    (tmp_path / "b.yaml").write_text("\n".join(f"{k}: {v}" for k, v in spec.items()))
    assert load_chip(str(tmp_path / "b.yaml")).memory_bandwidth == 1e10
    (tmp_path / "c.json").write_text(json.dumps({**spec, "bogus": 1}))
    with pytest.raises(ChipSpecError, match="unknown fields"):
        load_chip(str(tmp_path / "c.json"))
    (tmp_path / "d.json").write_text(json.dumps({**spec, "memory_bandwidth": -1}))
    with pytest.raises(ChipSpecError):
        load_chip(str(tmp_path / "d.json"))
    with pytest.raises(ChipSpecError, match="unknown chip"):
        load_chip("no-such-chip")
    assert load_chip("cpu-core").fast_memory_bytes > 0


def test_cli(capsys, tmp_path):
    path = shipped(TEST_FAST)
    assert main(["--model", str(path), "--chip", "cpu-core", "--chips", "4"]) == 0
    out = capsys.readouterr().out
    assert "plan: tp=" in out and "<- plan" in out
    assert main(["--model", str(path), "--chip", "h100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"]["tokens_per_s"] > 0 and data["chip"]["name"] == "h100"
    assert main(["--model", str(path), "--chip", "nope"]) == 2


def test_auto_layout_is_the_plan_on_the_chips_with_fixed_sizes_kept():
    path = shipped(TEST_FAST)
    cfg = json.loads((path / "config.json").read_text())
    for chips in (1, 2, 4):
        best, why = auto_layout(path, chips=chips)
        want, _ = plan(cfg, load_chip("cpu-core"), chips)
        assert (best.tp, best.pp) == (want.tp, want.pp) and why.endswith("per token.")
    assert auto_layout(path, chips=4, pp=2)[0].pp == 2  # a fixed size is kept, the other chosen
    assert (lambda b: (b.tp, b.pp))(auto_layout(path, chips=4, tp=2, pp=2)[0]) == (2, 2)
    assert auto_layout(path, chips=4, device="cuda")[0].chips >= 1  # GPUs plan as h100s
    with pytest.raises(PlanError, match="no valid layout with tp=3"):
        auto_layout(path, chips=4, tp=3)


def test_resolve_layout_follows_the_lane_config():
    from serve.config import FastLaneConfig
    from serve.lanes.sharded_engine import resolve_layout

    path = shipped(TEST_FAST)
    assert resolve_layout(path, FastLaneConfig(tp=1, pp=2), chips=1) == (1, 2, "set in the config")
    best, _ = auto_layout(path, chips=2, dtype=FastLaneConfig().dtype)  # the lane's dtype sizes the shards
    tp, pp, why = resolve_layout(path, FastLaneConfig(replicas=2), chips=4)  # 2 chips per replica
    assert (tp, pp) == (best.tp, best.pp) and "on 2 chip(s)" in why
