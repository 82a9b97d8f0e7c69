"""The quality eval: deterministic samples, metrics checked against independent computations."""

from __future__ import annotations

import json
import math

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from models.eval.backend import TransformersBackend, bits_per_byte
from models.eval.run import evaluate, main
from models.eval.samples import bpb_chunks, line_samples
from models.recipe import corpus


def held_files():
    return corpus.split(corpus.list_files())[1]


def test_line_samples_are_deterministic_and_well_formed():
    files = held_files()
    a = line_samples(files, 50, seed=1)
    assert a == line_samples(files, 50, seed=1)
    assert a != line_samples(files, 50, seed=2)
    texts = {f.rel_path: f.text for f in files}
    for s in a:
        assert s.prefix.endswith("\n") and s.target.strip() and "\n" not in s.target
        lines = texts[s.file].split("\n")
        assert lines[s.line_no] == s.target
        assert "\n".join(lines[: s.line_no]).endswith(s.prefix[:-1])
        assert len(s.prefix) <= 1000
        assert s.previous_line == lines[s.line_no - 1]


def test_bpb_chunks_cover_the_files_exactly():
    files = held_files()[:5]
    chunks = bpb_chunks(files, max_chunk_chars=300)
    assert "".join(chunks) == "".join(f.text for f in files)
    assert max(len(c) for c in chunks) <= 300


def test_bits_per_byte_matches_a_direct_computation(tiny_models):
    path = tiny_models / "full"
    text = "for i in range(10):\n    print(i)\n"
    backend = TransformersBackend(path)
    tok = AutoTokenizer.from_pretrained(path)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tok(text, return_tensors="pt").input_ids
    loss = model(input_ids=ids, labels=ids).loss.item()  # mean nats over the n predicted tokens
    expected = loss * (ids.shape[1] - 1) / math.log(2) / len(text.encode())
    assert math.isclose(bits_per_byte(backend.nll([text]), [text]), expected, rel_tol=1e-4)


def test_evaluate_on_a_small_sample(tiny_models, tmp_path):
    out = tmp_path / "eval.json"
    rc = main(["--model", str(tiny_models / "full"), "--model", str(tiny_models / "fast"),
               "--samples", "12", "--max-files", "3", "--max-tokens", "6",
               "--max-prefix-chars", "200", "--max-chunk-chars", "150", "--json", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert [m["name"] for m in result["models"]] == ["full", "fast"]
    for m in result["models"]:
        assert m["bits_per_byte"] > 0
        assert m["samples"] == 12 and 0 <= m["exact_match"] <= 1
    # The baseline is recomputed independently from the files.
    files = held_files()[:3]
    samples = line_samples(files, 12, seed=0, max_prefix_chars=200)
    hits = sum(s.prefix[:-1].split("\n")[-1] == s.target for s in samples)
    assert result["baseline"]["exact_match_count"] == hits
    assert set(result["agreement"]) == {"fast vs full"}


def test_exact_match_counts_identical_lines():
    """A backend that answers with the true line scores 100%; one that answers the previous line
    scores exactly the baseline."""
    files = held_files()[:4]
    samples = line_samples(files, 20, seed=0)
    truth = {s.prefix: s.target for s in samples}

    class Oracle:
        name = "oracle"

        def complete(self, prompts, max_tokens):
            return [truth[p] + "\nmore" for p in prompts]

        def nll(self, texts):
            return [0.0 for _ in texts]

    class Echo(Oracle):
        name = "echo"

        def complete(self, prompts, max_tokens):
            return [p[:-1].split("\n")[-1] for p in prompts]

    r = evaluate([Oracle(), Echo()], 20, 0, 8, max_files=4)
    assert r["models"][0]["exact_match"] == 1.0
    assert r["models"][1]["exact_match"] == r["baseline"]["exact_match"]
    assert r["agreement"]["echo vs oracle"] == r["baseline"]["exact_match"]


def test_chunks_and_prefixes_respect_a_token_budget():
    """With a budget test, every chunk and prefix fits it, and chunks still rebuild the files."""
    files = held_files()[:6]
    fits = lambda text: len(text.encode("utf-8")) <= 120  # noqa: E731 - a stand-in token count
    chunks = bpb_chunks(files, max_chunk_chars=1000, fits=fits)
    assert "".join(chunks) == "".join(f.text for f in files)
    assert all(fits(c) for c in chunks)
    samples = line_samples(files, 30, seed=0, fits=fits)
    assert all(fits(s.prefix) or s.prefix.count("\n") == 1 for s in samples)
