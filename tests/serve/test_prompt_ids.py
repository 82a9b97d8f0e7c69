"""``PromptIds`` gives exactly the ids of the ``tokenizers`` library's own whole-text encode, while a
conversation's next turn reuses its history's kept ids."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from models import FAST, FULL
from serve.lanes.prompt_ids import PromptIds, splits_at_newlines

LINES = ["def parse(line):", "    return line.split(',')", "", "  ", "class Parser:", "\t# tab\r", "x = '\u00e9t\u00e9'",
         "emoji \U0001F600 here", "    ", "import os", "a\u00a0b", "}"]


def _tokenizer(path) -> Tokenizer:
    return Tokenizer.from_file(str(path / "tokenizer.json"))


@pytest.mark.parametrize("path", [FAST, FULL], ids=["fast", "full"])
def test_shipped_tokenizers_split_at_newlines(path):
    assert PromptIds(_tokenizer(path)).incremental


@pytest.mark.parametrize("path", [FAST, FULL], ids=["fast", "full"])
def test_conversation_turns_equal_whole_encode(path):
    """20-turn conversations joined as the router joins them (lines of history, output, new input):
    every turn's ids equal the tokenizer's own encode of the whole text, and the history is reused."""
    tok = _tokenizer(path)
    ids = PromptIds(tok)
    rng = random.Random(0)
    for conversation in range(5):
        history = rng.choice(LINES) + str(conversation)
        for _ in range(20):
            got = ids.encode(history)
            assert got == tok.encode(history).ids
            output = "".join(rng.choice(["foo", " bar", "\n", "  ", "\u00e9", ")", "\n\n"]) for _ in range(rng.randint(0, 6)))
            new = "\n".join(rng.choice(LINES) for _ in range(rng.randint(1, 3)))
            history = history + "\n" + output + "\n" + new
    assert ids.reused_tokens > 0


def test_random_texts_and_cuts_equal_whole_encode():
    """Random texts continuing kept ones at any line break (empty lines, a trailing line break, CRLF,
    non-ASCII) and texts continuing nothing: always the whole encode's ids."""
    tok = _tokenizer(FAST)
    ids = PromptIds(tok)
    rng = random.Random(1)
    alphabet = ["a", "b", " ", "\n", "\r\n", "\t", "\u00e9", "\U0001F600", "1", "(", "def", "  ", "\n\n"]
    kept = []
    for _ in range(300):
        if kept and rng.random() < 0.7:
            text = rng.choice(kept) + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        else:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        assert ids.encode(text) == tok.encode(text).ids, repr(text)
        kept.append(text)
    assert ids.reused_tokens > 0


def test_a_change_inside_the_history_is_not_reused():
    tok = _tokenizer(FAST)
    ids = PromptIds(tok)
    ids.encode("def f(x):\n    return x")
    text = "def f(y):\n    return x\nprint(f(1))"
    assert ids.encode(text) == tok.encode(text).ids
    assert ids.reused_tokens == 0
    ids.encode("def f(y):\n    return x\nprint(f(1))\nmore")
    assert ids.reused_tokens == len(tok.encode(text).ids)


def test_kept_ids_are_bounded_and_least_recently_used_go_first():
    tok = _tokenizer(FAST)
    first, second = "alpha beta gamma", "delta epsilon zeta"
    n = len(tok.encode(first).ids)
    ids = PromptIds(tok, kept_tokens=n + len(tok.encode(second).ids))
    ids.encode(first)
    ids.encode(second)
    ids.encode(first + "\nx")  # uses ``first`` (now most recent), keeps the new prompt: ``second`` goes
    assert ids.reused_tokens == n
    ids.encode(second + "\ny")
    assert ids.reused_tokens == n  # ``second`` was evicted: tokenized whole
    assert ids._tokens <= ids.kept_tokens
    assert ids.encode(first + "\nx") == tok.encode(first + "\nx").ids


def test_returned_ids_are_the_callers_own():
    tok = _tokenizer(FAST)
    ids = PromptIds(tok)
    got = ids.encode("a\nb")
    got.append(-1)
    assert ids.encode("a\nb") == tok.encode("a\nb").ids
    assert ids.encode("a\nb\nc") == tok.encode("a\nb\nc").ids


def test_a_tokenizer_without_the_newline_split_tokenizes_whole():
    spec = json.loads(_tokenizer(FAST).to_str())
    spec["pre_tokenizer"] = spec["pre_tokenizer"]["pretokenizers"][1]  # ByteLevel alone: merges may cross "\n"
    tok = Tokenizer.from_str(json.dumps(spec))
    assert not splits_at_newlines(tok)
    ids = PromptIds(tok)
    assert not ids.incremental
    for text in ("x = 1", "x = 1\n  y = 2", "x = 1\n  y = 2\n\n z"):
        assert ids.encode(text) == tok.encode(text).ids
    assert ids.reused_tokens == 0


def test_encode_turn_says_whether_the_text_continues_a_kept_prompt():
    tok = _tokenizer(FAST)
    ids = PromptIds(tok)
    first = "def f(x):\n    return x"
    assert ids.encode_turn(first) == (tok.encode(first).ids, False)  # a conversation's first turn
    assert ids.encode_turn(first) == (tok.encode(first).ids, False)  # the same prompt again continues nothing
    second = first + "\n\nprint(f(1))"
    assert ids.encode_turn(second) == (tok.encode(second).ids, True)  # the next turn
    other = "def g(x):\n    return x"
    assert ids.encode_turn(other)[1] is False
