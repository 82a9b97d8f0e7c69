"""The ``auto`` router's difficulty signal: how surprised the fast model is by the prompt.

``score(prompt)`` is the fast model's mean next-token loss (nats per token) over the prompt's
last ``max_tokens`` tokens. A low score means the prompt is the kind of text the small model
predicts well (boilerplate, repetition, common idioms), where its continuation is likely as good
as the full model's; a high score means unfamiliar or dense text, which goes to the full model.
It costs one prefill of the small model, in the router's own process (about a millisecond per
hundred tokens on a CPU core for the shipped fast model), and needs no extra model.

``python -m serve.difficulty`` prints the score's distribution on the held-out eval prompts and,
per quartile, how often the fast model's next line is exactly right compared with the full model's
(the evidence for the default threshold; see docs/serving.md).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from sharding.engine import Engine

from .lanes.prompt_ids import PromptIds


class DifficultyScorer:
    """Scores prompts with the fast model, in this process (thread-safe; one prompt at a time)."""

    def __init__(self, path: str | Path, max_tokens: int = 128) -> None:
        self.tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
        self.prompt_ids = PromptIds(self.tokenizer)  # a conversation's next turn: only its new text
        self.max_tokens = max_tokens
        # One small prefill per request: more intra-op threads would only contend with the
        # engines' processes for the same cores.
        torch.set_num_threads(1)
        self.engine = Engine.from_pretrained(path, num_slots=1, max_len=max_tokens + 1)
        self._lock = threading.Lock()

    def score(self, prompt: str) -> float:
        """Mean loss in nats per token of the prompt's last ``max_tokens`` tokens (0 if too short)."""
        with self._lock:
            ids = self.prompt_ids.encode(prompt)
        if len(ids) > self.max_tokens:  # keep <|bos|>, then the tail
            ids = ids[:1] + ids[len(ids) - self.max_tokens + 1:]
        if len(ids) < 2:
            return 0.0
        with self._lock, torch.inference_mode():
            logits = self.engine.prompt_logits(ids)  # [S, V]
        return F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:])).item()


def main(argv: list[str] | None = None) -> int:
    import argparse

    from models import FAST, FULL
    from models.eval.run import first_line
    from models.eval.samples import line_samples
    from models.recipe.corpus import list_files, split
    from sharding.sampling import SamplingParams

    ap = argparse.ArgumentParser(prog="python -m serve.difficulty", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128, help="prompt tokens scored")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    scorer = DifficultyScorer(FAST, args.max_tokens)
    samples = line_samples(split(list_files())[1], args.samples, seed=1)
    engines = {name: Engine.from_pretrained(p, num_slots=1) for name, p in (("fast", FAST), ("full", FULL))}
    rows = []
    for s in samples:
        ids = scorer.tokenizer.encode(s.prefix).ids[-400:]
        target = scorer.tokenizer.encode(s.target + "\n", add_special_tokens=False).ids
        row = [scorer.score(s.prefix)]
        for eng in engines.values():
            out = eng.generate([ids], SamplingParams(temperature=0, max_tokens=40))[0]
            row.append(first_line(scorer.tokenizer.decode(out)) == s.target)
        for eng in engines.values():  # the true next line's loss, nats per token
            logits = eng.prompt_logits(ids + target)[len(ids) - 1:-1]
            row.append(F.cross_entropy(logits.float(), torch.tensor(target)).item())
        rows.append(row)
    rows.sort()
    q = len(rows) // 4
    print(f"{len(rows)} held-out next-line prompts (seed 1); score = the fast model's mean loss on the prompt")
    print(f"{'quartile':<10}{'score range':<15}{'fast EM':>9}{'full EM':>9}{'fast loss':>11}{'full loss':>11}")
    for i in range(4):
        part = rows[i * q:(i + 1) * q] if i < 3 else rows[3 * q:]
        mean = [sum(r[k] for r in part) / len(part) for k in range(1, 5)]
        print(f"Q{i + 1:<9}{part[0][0]:.2f}-{part[-1][0]:.2f}{'':<6}{mean[0]:>8.1%}{mean[1]:>9.1%}"
              f"{mean[2]:>11.3f}{mean[3]:>11.3f}")
    print("loss: of the true next line (nats/token) given the prompt, under each model")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
