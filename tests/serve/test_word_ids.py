"""``WordIds`` gives exactly the ids of the ``tokenizers`` library's own encode (with and without
special tokens), on the shipped tokenizers, for every ASCII text Hypothesis finds and for real code;
a tokenizer of another recipe is encoded by the library itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from models import TEST_FAST, TEST_FULL
from serve.lanes.word_ids import MAX_WORDS, WordIds, byte_level_bpe

REPO = Path(__file__).resolve().parents[2]
TOKENIZERS = {"fast": Tokenizer.from_file(str(TEST_FAST / "tokenizer.json")),
              "full": Tokenizer.from_file(str(TEST_FULL / "tokenizer.json"))}
# Every ASCII character, the spaces and the contractions' pieces oftener: where the regex has edges.
PIECES = st.one_of(st.characters(max_codepoint=127), st.sampled_from([" ", "  ", "\n", "\t", "\r", "\x0b", "\x0c",
                   "\x1c", "\x1f", "\x85", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "<|bos|>", "<|eos|>", "\u00e9",
                   "\u00a0", "12", "ab", " x"]))
TEXTS = st.lists(PIECES, max_size=40).map("".join)


def _check(ids: WordIds, tok: Tokenizer, text: str) -> None:
    assert ids.encode(text) == tok.encode(text).ids, repr(text)
    assert ids.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False).ids, repr(text)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_the_shipped_tokenizers_take_the_fast_way(name):
    tok = TOKENIZERS[name]
    ids = WordIds(tok)
    assert byte_level_bpe(tok) and ids.fast
    assert ids.prefix == tok.encode("").ids and ids.suffix == []


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=200, deadline=None)
@given(text=TEXTS)
def test_any_text_equals_the_tokenizers_own_encode(name, text):
    _check(WordIds(TOKENIZERS[name]), TOKENIZERS[name], text)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_real_code_equals_the_tokenizers_own_encode_with_the_words_kept(name):
    """Every Python file of this repository, line by line and whole, through one ``WordIds`` (its
    kept words reused from file to file)."""
    tok, ids = TOKENIZERS[name], WordIds(TOKENIZERS[name])
    files = sorted((REPO / "serve").rglob("*.py")) + sorted((REPO / "sharding").rglob("*.py"))
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        _check(ids, tok, text)
        for line in text.splitlines()[:50]:
            assert ids.encode(line) == tok.encode(line).ids, repr(line)
    assert len(ids._words) > 1000


def test_a_full_cache_starts_again_and_stays_exact(monkeypatch):
    monkeypatch.setattr("serve.lanes.word_ids.MAX_WORDS", 8)
    tok = TOKENIZERS["fast"]
    ids = WordIds(tok)
    for i in range(50):
        text = f"word{i} other{i * 7} x_{i}\n"
        assert ids.encode(text) == tok.encode(text).ids
    assert 0 < len(ids._words) <= 8 < MAX_WORDS


def test_a_tokenizer_of_another_recipe_is_encoded_whole():
    """The fast tokenizer with a normalizer (lowercase) is not the recipe: every text goes to the
    library, whose lowercasing shows in the ids."""
    spec = json.loads(TOKENIZERS["fast"].to_str())
    spec["normalizer"] = {"type": "Lowercase"}
    tok = Tokenizer.from_str(json.dumps(spec))
    ids = WordIds(tok)
    assert not ids.fast and not byte_level_bpe(tok)
    assert ids.encode("Class Parser") == tok.encode("Class Parser").ids == tok.encode("class parser").ids
