"""``TextStream`` against ``tokenizers``' own full decode, token by token, with stop strings."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from models import TEST_FAST
from serve.lanes.detokenizer import TextStream
from tests.conftest import shipped

TEXTS = ["def f(x):\n    return x  # ok\n", "naïve café — 東京 😀 done\n", "\t\r\nzero\u200bwidth\u00a0nbsp"]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(shipped(TEST_FAST) / "tokenizer.json"))


def stream(tok: Tokenizer, ids: list[int], stop=None, chunk: int = 1) -> tuple[str, bool]:
    ts = TextStream(tok, stop)
    out = "".join(ts.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk))
    return out + ts.flush(), ts.stopped


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_incremental_text_equals_the_full_decode(tok, text, chunk):
    ids = tok.encode(text).ids  # with <|bos|>, which is skipped like every special token
    assert stream(tok, ids, chunk=chunk) == (tok.decode(ids, skip_special_tokens=True), False)


def test_random_token_sequences(tok):
    # Byte-level tokens need not form UTF-8. Like vLLM's detokenizer (also a DecodeStream), an
    # incomplete character still pending when the sequence ends is not sent; everything else is.
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randrange(1, 40))]
        full = tok.decode(ids, skip_special_tokens=True)
        got = stream(tok, ids)[0]
        assert got == full or (full.endswith("\ufffd") and full.startswith(got) and
                               set(full[len(got):]) == {"\ufffd"}), (got, full)


@pytest.mark.parametrize("text", TEXTS)
def test_stop_strings_cut_before_the_first_one(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    full = tok.decode(ids)
    for stop in (["\n"], ["(x", "return"], ["😀"], [full[-3:]], ["absent"]):
        cut = min((full.index(s) for s in stop if s in full), default=None)
        got, stopped = stream(tok, ids, stop)
        assert got == (full if cut is None else full[:cut]) and stopped == (cut is not None), stop


def test_held_back_text_is_never_retracted(tok):
    ids = tok.encode("abc abd abe", add_special_tokens=False).ids
    ts = TextStream(tok, ["abf"])
    pieces = [ts.push([i]) for i in ids]
    assert "".join(pieces) + ts.flush() == "abc abd abe"


def test_a_stop_token_adds_no_text(tok):
    """As vLLM's detokenizer (``include_stop_str_in_output`` off): the token that ended the sequence
    (a ``stop_token_ids`` id, here a plain word) is in the output's ids, not in its text."""
    ids = tok.encode("def f(x): return x", add_special_tokens=False).ids
    ts = TextStream(tok)
    got = ts.push(ids[:3]) + ts.push(ids[3:], stop_token=True) + ts.flush()
    assert got == tok.decode(ids[:-1])


@pytest.mark.parametrize("min_tokens", [0, 1, 3, 6, 50])
def test_with_min_tokens_a_stop_string_counts_once_it_ends_past_their_text(tok, min_tokens):
    """vLLM's rule (its ``min_tokens`` with stop strings): only a stop string that ends after the text
    of the first ``min_tokens`` tokens ends the text."""
    ids = tok.encode("a = 1\nb = 2\nc = 3\n", add_special_tokens=False).ids
    full = tok.decode(ids)
    floor = len(tok.decode(ids[:min_tokens]))
    cut = next((i for i in range(len(full)) if full.startswith("\n", i) and i + 1 > floor), None)
    ts = TextStream(tok, ["\n"], min_tokens=min_tokens)
    got = "".join(ts.push([i]) for i in ids) + ts.flush()
    assert got == (full if cut is None else full[:cut]) and ts.stopped == (cut is not None)


def vllm_detokenizer(tok: Tokenizer, stop: list[str], min_tokens: int = 0):
    """vLLM's own incremental detokenizer (``FastIncrementalDetokenizer``, what its output processor
    runs for every request) over ``tok``, with ``stop`` strings."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    params = SamplingParams(stop=stop, min_tokens=min_tokens)
    return FastIncrementalDetokenizer(SimpleNamespace(_tokenizer=tok),
                                      SimpleNamespace(request_id="r", prompt_token_ids=None, sampling_params=params))


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [2, 5])
@pytest.mark.parametrize("min_tokens", [0, 3])
def test_tokens_after_the_one_completing_a_stop_string_are_not_kept_as_vllms(tok, text, chunk, min_tokens):
    """Several tokens pushed at once (a step's accepted drafts): ``kept`` is how many the output keeps,
    up to the token whose text completes the stop string, as vLLM's detokenizer keeps (its
    ``num_output_tokens``: the output processor drops the rest and their log probabilities)."""
    ids = tok.encode(text, add_special_tokens=False).ids
    full = tok.decode(ids)
    dropped = 0
    for stop in (full[len(full) // 3:len(full) // 3 + 2], full[len(full) // 2], full[-2:]):
        ts, ref = TextStream(tok, [stop], min_tokens=min_tokens), vllm_detokenizer(tok, [stop], min_tokens)
        kept, ref_kept = [], []
        for i in range(0, len(ids), chunk):
            step = ids[i:i + chunk]
            ts.push(step)
            kept.append(ts.kept)
            before = ref.num_output_tokens()
            stopped = ref.update(step, False)
            ref_kept.append(ref.num_output_tokens() - before)
            if stopped:
                dropped += len(step) - ts.kept
                break
        assert ts.stopped and kept == ref_kept, (stop, kept, ref_kept)
        assert ts.flush() == "" and ref.output_text == ts._text
        ts.push(ids[:1])
        assert ts.kept == 0  # nothing after the stop
    assert dropped > 0  # some step had tokens past its stop string
