"""``bench.sharding``: a layout the model's shape does not allow is skipped with the executor's reason."""

from __future__ import annotations

from transformers import LlamaConfig

from bench.report import sharding_section
from bench.sharding import main


def test_no_layout_that_fits_is_a_message_not_a_crash(tmp_path, capsys):
    # SmolLM2-135M's attention shape: 9 query heads, 3 kv heads: no tensor-parallel size of 2
    LlamaConfig(hidden_size=72, intermediate_size=128, num_hidden_layers=2, num_attention_heads=9,
                num_key_value_heads=3, vocab_size=64).save_pretrained(tmp_path)
    assert main(["--model", tmp_path, "--layouts", "2x1,2x2"]) == 2
    err = capsys.readouterr().err
    assert "'2x1': 'tensor parallel size 2 does not divide num_attention_heads=9" in err and "'2x2'" in err


def test_the_report_says_which_layouts_were_skipped_and_why():
    doc = {"steps": 8, "cores": 2, "layouts": [], "skipped_layouts": {"2x1": "tensor parallel size 2 does not divide x"}}
    assert "Not run: 2x1 (tensor parallel size 2 does not divide x)." in sharding_section(doc)
