"""``fastmode demo``: both models generating on fastmode's own executor, without serving.

Completes one Python prompt (greedy) with both models of the embedded default on fastmode's own executor: the
full model in process, the fast model as a two-stage pipeline across two chip actors on a local
Ray, with the chip-to-chip hops it measured. ``--transformers`` runs both in transformers instead.
"""

from __future__ import annotations

import argparse
import statistics
import time

DEFAULT_PROMPT = "import os\n\n\ndef read_lines(path):\n"


def _decode(engine, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float, list]:
    from sharding.sampling import SamplingParams

    engine.add("demo", prompt_ids, SamplingParams(temperature=0, max_tokens=max_tokens))
    out, hops = [], []
    started = time.perf_counter()
    while engine.has_work:
        for o in engine.step():
            out += o.token_ids
        hops += getattr(engine, "last_hops", None) or []
    return out, time.perf_counter() - started, hops


def _ours(prompt: str, max_tokens: int) -> None:
    import ray
    from transformers import AutoTokenizer

    from sharding.engine import Engine
    from sharding.pipeline import ShardedModel

    from models.builtin import default_pair

    FULL, FAST = default_pair()
    tok = AutoTokenizer.from_pretrained(FULL)
    ids = tok(prompt).input_ids
    full = Engine.from_pretrained(FULL, num_slots=1)
    new, seconds, _ = _decode(full, ids, max_tokens)
    print(f"--- full ({FULL}), in process ---\n{prompt}{tok.decode(new, skip_special_tokens=True)}")
    print(f"--- {len(new)} tokens in {seconds:.2f}s ({len(new) / seconds:.0f} tokens/s)\n")

    ray.init(address="local", resources={"chip": 2}, include_dashboard=False, log_to_driver=False)
    try:
        with ShardedModel.from_pretrained(FAST, tp=1, pp=2, num_slots=1) as fast:
            new, seconds, hops = _decode(fast, ids, max_tokens)
            print(f"--- fast ({FAST}), pipeline of 2 chips ---\n{prompt}{tok.decode(new, skip_special_tokens=True)}")
            print(f"--- {len(new)} tokens in {seconds:.2f}s ({len(new) / seconds:.0f} tokens/s)")
            by_pair: dict[tuple, list] = {}
            for h in hops:
                by_pair.setdefault((h.src_chip, h.dst_chip), []).append(h)
            for (src, dst), hs in by_pair.items():
                print(f"    hop {src} -> {dst}: {len(hs)} hops, {hs[0].bytes} B, "
                      f"median {statistics.median(h.seconds for h in hs) * 1e3:.2f} ms")
    finally:
        ray.shutdown()


def _transformers(prompt: str, max_tokens: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from models.builtin import default_pair

    for name, path in zip(("full", "fast"), default_pair()):
        tok = AutoTokenizer.from_pretrained(path)
        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        ids = tok(prompt, return_tensors="pt").input_ids
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        seconds = time.perf_counter() - started
        new = out[0, ids.shape[1]:]
        print(f"--- {name} ({path}), transformers ---\n{prompt}{tok.decode(new, skip_special_tokens=True)}")
        print(f"--- {len(new)} tokens in {seconds:.2f}s ({len(new) / seconds:.0f} tokens/s)\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastmode demo", description=__doc__)
    p.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="text to complete")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--transformers", action="store_true", help="run both models in transformers instead")
    args = p.parse_args(argv)
    (_transformers if args.transformers else _ours)(args.prompt, args.max_tokens)
    return 0
