"""``fastmode demo``: the embedded default until the serving lanes land.

Loads both shipped models and completes one Python prompt with each (greedy), printing the text
and tokens/s, so a new user sees the pair working within seconds of install.
"""

from __future__ import annotations

import argparse
import time

import torch

from models import FAST, FULL

DEFAULT_PROMPT = "import os\n\n\ndef read_lines(path):\n"


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer, LlamaForCausalLM

    p = argparse.ArgumentParser(prog="fastmode demo", description=__doc__)
    p.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="text to complete")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    for name, path in (("full", FULL), ("fast", FAST)):
        tok = AutoTokenizer.from_pretrained(path)
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        ids = tok(args.prompt, return_tensors="pt").input_ids
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        seconds = time.perf_counter() - started
        new = out[0, ids.shape[1]:]
        params = sum(p.numel() for p in model.parameters())
        print(f"--- {name} ({params / 1e6:.1f}M parameters, {path}) ---")
        print(args.prompt + tok.decode(new, skip_special_tokens=True))
        print(f"--- {len(new)} tokens in {seconds:.2f}s ({len(new) / seconds:.0f} tokens/s, transformers, batch 1)\n")
    return 0
