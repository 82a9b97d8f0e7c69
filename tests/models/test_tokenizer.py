"""The shipped tokenizer: exact round trips through transformers' loader, and the same ids as tokenizers."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from models import TEST_FULL
from tests.conftest import shipped

ODD_TEXTS = [
    "",
    " ",
    "\n",
    "\r\n\r\n",
    "\t\tx = 1\n",
    "   trailing spaces   \n\n\n",
    "def f(x):\r\n\treturn  x\u00a0+ 1  # comment\u200b\n",
    "你好，世界 🙂👩‍👩‍👧 e\u0301 \ufeff\u2028\u2029\x00\x7f",
    "\U0010ffff\ud7ff",
]


def random_unicode(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        cp = rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0, 0x20), rng.randrange(0xA0, 0xD800),
                         rng.randrange(0xE000, 0x110000), ord(rng.choice(" \t\n\r"))])
        out.append(chr(cp))
    return "".join(out)


def _texts():
    rng = random.Random(0)
    return ODD_TEXTS + [random_unicode(rng, rng.randrange(1, 80)) for _ in range(200)]


@pytest.fixture(params=["tiny", "shipped"])
def tokenizer_dir(request):
    """The tokenizer the tiny recipe makes, and the shipped one (both models share it)."""
    if request.param == "tiny":
        return request.getfixturevalue("tiny_models") / "full"
    return shipped(TEST_FULL)


def test_round_trip_exact(tokenizer_dir):
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in _texts():
        ids = hf(text).input_ids
        assert ids[0] == hf.bos_token_id == 0
        assert hf.decode(ids, skip_special_tokens=True) == text
        assert hf.decode(ids[1:]) == text


def test_literal_special_token_text(tokenizer_dir):
    """Like transformers and vLLM defaults, literal special-token strings parse as special tokens;
    they still decode back exactly unless the caller asks to skip special tokens."""
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "a<|bos|> literal <|eos|>b"
    ids = hf(text).input_ids
    assert hf.eos_token_id in ids[1:]
    assert hf.decode(ids[1:]) == text


def test_special_tokens(tokenizer_dir):
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)


def test_same_ids_as_tokenizers_library(tokenizer_dir):
    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    for text in _texts()[:50]:
        assert hf(text).input_ids == raw.encode(text).ids


def test_prompt_ending_at_newline_tokenizes_as_in_training(tokenizer_dir):
    """A prefix cut at a line break gives exactly the prefix of the whole text's ids."""
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "class A:\n    def f(self):\n        return 1\n\n\n    x = [\n\t1]\n"
    full_ids = hf(text).input_ids
    pos = 0
    while (pos := text.find("\n", pos) + 1) > 0:
        assert full_ids[: len(hf(text[:pos]).input_ids)] == hf(text[:pos]).input_ids
