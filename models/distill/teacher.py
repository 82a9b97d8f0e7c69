"""The full model's answers and its top-k distribution at every answer position: the training set.

Each prompt is rendered with the full model's chat template (generation prompt added) and answered
greedily, up to ``max_new_tokens`` or the model's end of turn (kept: the student learns to stop).
From the same ``generate`` call come the raw logits of every answer position, of which the top
``top_k`` log-probabilities are kept. Answers are written in shards of ``gen_batch`` prompts under
the run's work folder, so an interrupted run resumes at the first missing shard.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm import tqdm


def _end_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, model.config.eos_token_id, tokenizer.eos_token_id):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    return ids


def prompt_ids(tokenizer, prompt) -> list[int]:
    """``prompt`` (one user message, or ``(role, content)`` pairs) through the model's chat template,
    generation prompt added (a model without a template: the messages' contents joined by newlines,
    plainly encoded)."""
    turns = [("user", prompt)] if isinstance(prompt, str) else list(prompt)
    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in turns], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return tokenizer("\n".join(c for _, c in turns), add_special_tokens=True)["input_ids"]


@torch.no_grad()
def answer(model, tokenizer, prompts: list, *, max_new_tokens: int, top_k: int) -> list[dict]:
    """One batch: per prompt, ``ids`` (prompt + answer), ``prompt_len``, and per answer token the
    teacher's ``topk_ids`` [n, k] (int32) and ``topk_logp`` [n, k] (float32 log-probabilities)."""
    end = _end_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(end))
    encoded = [prompt_ids(tokenizer, p) for p in prompts]
    width = max(len(e) for e in encoded)
    input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # left padding
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=pad,
                         eos_token_id=sorted(end) or None)
    answers = out.sequences[:, width:]  # [B, T]
    logits = torch.stack(out.logits, dim=1).float()  # [B, T, V]: the distribution of each answer token
    rows = []
    for b, prompt in enumerate(encoded):
        tokens = answers[b].tolist()
        n = len(tokens)
        for i, t in enumerate(tokens):
            if t in end:
                n = i + 1  # the end-of-turn token is kept
                break
        logp = torch.log_softmax(logits[b, :n], dim=-1)
        values, indices = logp.topk(top_k, dim=-1)
        rows.append({"ids": prompt + tokens[:n], "prompt_len": len(prompt),
                     "topk_ids": indices.to(torch.int32), "topk_logp": values})
    return rows


def build(model, tokenizer, prompts: list, work_dir: Path, *, batch: int, max_new_tokens: int,
          top_k: int) -> tuple[list[dict], float]:
    """Every prompt's answer (resuming from ``work_dir``'s shards) and the seconds spent in this call."""
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict] = []
    shards = range(0, len(prompts), batch)
    bar = tqdm(total=len(prompts), desc="full model answers", unit="prompt", dynamic_ncols=True)
    for start in shards:
        end = min(start + batch, len(prompts))
        path = work_dir / f"prompts-{start:05d}-{end:05d}.pt"
        if path.exists():
            shard = torch.load(path, weights_only=False)
        else:
            shard = answer(model, tokenizer, prompts[start:end], max_new_tokens=max_new_tokens,
                           top_k=top_k)
            tmp = path.with_suffix(".tmp")
            torch.save(shard, tmp)
            tmp.replace(path)
        rows.extend(shard)
        bar.update(len(shard))
    bar.close()
    return rows, time.perf_counter() - started
