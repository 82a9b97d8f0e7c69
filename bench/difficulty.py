"""Calibrating ``auto``'s difficulty score (``serve.difficulty``) on held-out next-line prompts.

``python -m bench.difficulty`` prints the score's distribution on the held-out eval prompts and, per
quartile, how often the fast model's next line is exactly right compared with the full model's, and
each model's loss on the true next line: how well the score separates the prompts each model gets
right, which ``auto``'s rule rests on (the threshold itself comes from the quality stage's offline
sweep, ``bench.auto_policy``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serve.difficulty import DifficultyScorer
from sharding.engine import Engine


def main(argv: list[str] | None = None) -> int:
    import argparse

    from models import TEST_FAST, TEST_FULL
    from models.eval.run import first_line
    from models.eval.samples import line_samples
    from models.recipe.corpus import list_files, split
    from sharding.sampling import SamplingParams

    ap = argparse.ArgumentParser(prog="python -m bench.difficulty", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128, help="prompt tokens scored")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    scorer = DifficultyScorer(TEST_FAST, args.max_tokens)
    samples = line_samples(split(list_files())[1], args.samples, seed=1)
    engines = {name: Engine.from_pretrained(p, num_slots=1) for name, p in (("fast", TEST_FAST), ("full", TEST_FULL))}
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
