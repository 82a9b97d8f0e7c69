"""Token streams for training and held-out loss, with batches that depend only on (seed, step).

Each file becomes ``[bos] + tokens + [eos]``; files are concatenated into one stream. A batch is
``batch_size`` random windows of ``seq_len + 1`` tokens drawn with a generator seeded by
``(seed, step)``, so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from .corpus import SourceFile


def encode_files(tok: Tokenizer, files: list[SourceFile], bos_id: int, eos_id: int) -> torch.Tensor:
    """One int32 stream of every file's tokens, framed by bos/eos."""
    encs = tok.encode_batch([f.text for f in files], add_special_tokens=False)
    parts = []
    for enc in encs:
        parts.append(torch.tensor([bos_id] + enc.ids + [eos_id], dtype=torch.int32))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32)


def batch_at(stream: torch.Tensor, step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    """``[batch_size, seq_len + 1]`` int64 windows for optimizer step ``step``."""
    if stream.numel() < seq_len + 2:
        raise ValueError(f"token stream of {stream.numel()} tokens is shorter than seq_len {seq_len}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=g)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    return stream[idx].long()


def eval_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping ``[n, seq_len + 1]`` windows from the start of the held-out stream."""
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    if n < 1:
        raise ValueError("held-out stream too short for one evaluation window")
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)]).long()
