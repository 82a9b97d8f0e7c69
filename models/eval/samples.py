"""What the quality eval scores, drawn deterministically from the held-out files.

- Next-line samples: a prefix of a held-out file that ends at a newline, and the true next
  line. Only targets with non-whitespace content count (predicting a blank line is trivial).
  Prefixes are cut to their last whole lines within ``max_prefix_chars`` so they fit the
  models' context with room to generate.
- Bits-per-byte chunks: every held-out file split at line boundaries into chunks of at most
  ``max_chunk_chars``; each chunk is scored on its own (conditioned on ``<|bos|>`` only).

Everything is text: the eval knows nothing of the engine that produces tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

Fits = Callable[[str], bool]
"""Whether a text fits a token budget (the eval measures with the checkpoint's own tokenizer)."""


def _always(_: str) -> bool:
    return True

from models.recipe.corpus import SourceFile


@dataclass(frozen=True)
class LineSample:
    """One next-line question: greedy-decode after ``prefix``; compare with ``target``."""

    file: str
    line_no: int
    """0-based index of the target line in its file."""
    prefix: str
    """Text before the target line; ends with a newline."""
    target: str
    """The true next line, without its newline."""

    @property
    def previous_line(self) -> str:
        """The line just before the target (the trivial baseline's prediction)."""
        return self.prefix[:-1].rsplit("\n", 1)[-1]


def line_samples(files: list[SourceFile], n: int, seed: int = 0, max_prefix_chars: int = 1000,
                 fits: Fits = _always) -> list[LineSample]:
    """``n`` samples drawn uniformly (seeded) from all eligible lines of ``files``; each prefix is
    the longest run of whole lines before the target within ``max_prefix_chars`` that ``fits``."""
    candidates: list[tuple[int, int]] = []
    split_files = [f.text.split("\n") for f in files]
    for fi, lines in enumerate(split_files):
        # The last element after split is the text after the final newline: not a whole line.
        for li in range(1, len(lines) - 1):
            if lines[li].strip():
                candidates.append((fi, li))
    if len(candidates) < n:
        raise ValueError(f"only {len(candidates)} eligible lines in the held-out files, asked for {n}")
    picked = sorted(random.Random(seed).sample(candidates, n))
    out = []
    for fi, li in picked:
        lines = split_files[fi]
        start = li
        size = 0
        while start > 0 and size + len(lines[start - 1]) + 1 <= max_prefix_chars:
            if not fits("\n".join(lines[start - 1 : li]) + "\n"):
                break
            start -= 1
            size += len(lines[start]) + 1
        if start == li:  # a single previous line longer than the budget: keep its tail
            prefix = (lines[li - 1] + "\n")[-max_prefix_chars:]
        else:
            prefix = "\n".join(lines[start:li]) + "\n"
        out.append(LineSample(files[fi].rel_path, li, prefix, lines[li]))
    return out


def bpb_chunks(files: list[SourceFile], max_chunk_chars: int = 1200, fits: Fits = _always) -> list[str]:
    """Held-out text split at newlines into chunks of at most ``max_chunk_chars`` that ``fits``
    (a single line too long for either is split hard). Joined back, the chunks are exactly the
    files' texts."""

    def ok(text: str) -> bool:
        return len(text) <= max_chunk_chars and fits(text)

    chunks = []
    for f in files:
        cur = ""
        for line in f.text.splitlines(keepends=True):
            if ok(cur + line):
                cur += line
                continue
            if cur:
                chunks.append(cur)
                cur = ""
            while not ok(line):
                cut = min(len(line), max_chunk_chars)
                while cut > 1 and not ok(line[:cut]):
                    cut = cut * 3 // 4
                chunks.append(line[:cut])
                line = line[cut:]
            cur = line
        if cur:
            chunks.append(cur)
    return chunks
