"""The exact tier (``service_tier: "exact"``): the full model's own greedy output, token for token, on
a sample of the quality benchmark's held-out prompts (transformers is the reference), with its
speculative decoding reported on every front door."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from models import TEST_FULL
from models.eval.samples import line_samples
from models.recipe import corpus
from tests.conftest import shipped

SAMPLES = 6
TOKENS = 32


@pytest.fixture(scope="module")
def held_out() -> list[tuple[str, str]]:
    """(prompt, transformers' greedy text of the full model) for held-out next-line prompts."""
    path = shipped(TEST_FULL)
    tok = AutoTokenizer.from_pretrained(path)
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    _, held = corpus.split(corpus.list_files())
    out = []
    for s in line_samples(held, SAMPLES, seed=0, max_prefix_chars=600):
        ids = tok(s.prefix, return_tensors="pt").input_ids
        want = hf.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                           pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        out.append((s.prefix, tok.decode(want, skip_special_tokens=True)))
    return out


@pytest.mark.slow
def test_exact_tier_is_the_full_models_greedy_output_on_held_out_prompts(app, held_out):
    from clients.sdk import Client

    a = app()
    with Client(a.base.replace("http", "ws", 1), api_key=a.key) as client:
        for prompt, want in held_out:
            r = client.responses.create(model="fastmode-full", service_tier="exact", input=prompt, temperature=0,
                                        max_output_tokens=TOKENS, ignore_eos=True)
            assert r.lane == "exact" and r.text == want, prompt[-80:]
            s = r.speculative
            assert 0 <= s["draft_tokens"] <= 3 and s["verify_steps"] >= 1, s  # adaptive k
            assert 0 <= s["accepted"] <= s["drafted"] <= 3 * s["verify_steps"], s
            assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["drafted"])
            assert s["tokens_per_step"] == pytest.approx(1 + s["accepted"] / s["verify_steps"])
            # the prefill's token, then each verify step's accepted drafts and its own token (the last
            # step's may run past max_output_tokens)
            assert s["verify_steps"] < r.usage.output_tokens <= 1 + s["accepted"] + s["verify_steps"], s


@pytest.mark.slow
def test_exact_tier_reports_its_drafts_on_the_openai_api(app):
    import openai

    a = app()
    oai = openai.OpenAI(base_url=a.base + "/v1", api_key=a.key, max_retries=0, timeout=120)
    r = oai.completions.create(model="fastmode-full", prompt="def parse(text):\n", max_tokens=24, temperature=0,
                               extra_body={"service_tier": "exact"})
    assert r.service_tier == "exact" and r.model_extra["fastmode"]["lane"] == "exact"
    spec = r.model_extra["fastmode"]["speculative"]
    assert spec["verify_steps"] >= 1 and 1 <= spec["tokens_per_step"] <= 1 + spec["draft_tokens"]
    plain = oai.completions.create(model="fastmode-full", prompt="def parse(text):\n", max_tokens=24, temperature=0)
    assert r.choices[0].text == plain.choices[0].text and "speculative" not in plain.model_extra["fastmode"]
