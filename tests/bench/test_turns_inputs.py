"""``bench.turns.conversation_inputs``: every turn is a whole line of a held-out file, in file
order, of ``LINE_TOKENS`` tokens under the shipped models' tokenizer (so turn 1 sends as much new
input as turn 20), and the files are the held-out ones (no model saw them in training)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench.turns import LINE_TOKENS, conversation_inputs
from models import TEST_FAST, TEST_FULL
from models.recipe import corpus

TURNS = 20


def test_turns_are_whole_held_out_lines_of_one_size():
    tokenizer = Tokenizer.from_file(str(Path(TEST_FULL) / "tokenizer.json"))
    assert Path(TEST_FAST, "tokenizer.json").read_bytes() == Path(TEST_FULL, "tokenizer.json").read_bytes()
    _, held = corpus.split(corpus.list_files())
    lo, hi = LINE_TOKENS
    convs = conversation_inputs(None, TURNS)
    assert len(convs) >= 12 + 1  # make bench's lanes: 4 slots x 3 repeats measured, others around them
    files = iter(held)
    for lines in convs:
        assert len(lines) == TURNS
        f = next(file for file in files if lines[0] in file.text.splitlines())  # held-out files, in order
        file_lines = f.text.splitlines()
        at = -1
        for line in lines:  # whole lines of that file, in its order
            at = file_lines.index(line, at + 1)
        assert all(lo <= len(tokenizer.encode(line).ids) <= hi for line in lines)
    firsts = sorted(len(tokenizer.encode(c[0]).ids) for c in convs)
    lasts = sorted(len(tokenizer.encode(c[-1]).ids) for c in convs)
    assert abs(firsts[len(firsts) // 2] - lasts[len(lasts) // 2]) <= 2  # turn 1's lines as long as turn 20's


def test_too_many_conversations_is_a_clear_error():
    with pytest.raises(RuntimeError, match="fewer than 1000 files of 20 lines of 8-16 tokens"):
        conversation_inputs(1000, TURNS)
