"""The body of one tensor-parallel rank in the TP tests (spawned twice, gloo on CPU).

Kept apart from the test module so a spawned rank imports only torch and ``sharding``.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch
import torch.distributed as dist

from sharding.engine import Engine
from sharding.kv_cache import KVCache
from sharding.sampling import SamplingParams
from sharding.weights import load_model


@torch.inference_mode()
def _logits(models: list, ids: list[int]) -> torch.Tensor:
    """Prompt logits ``[S, V]`` through a chain of stages (one stage: the whole model)."""
    x = torch.tensor([ids])
    positions = torch.arange(len(ids))[None]
    slots = torch.tensor([0])
    for m in models:
        x = m(x, positions, slots, KVCache.for_model(m, num_slots=1))
    return models[-1].compute_logits(x)[0]


def run(rank: int, world_size: int, init_file: str, jobs: list[dict], out_dir: str) -> None:
    """Run each job ``{"path", "prompt", "new_tokens"}``; save the results to ``out_dir/rank{rank}.pt``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        tp = dict(tp_rank=rank, tp_size=world_size)
        results = []
        for job in jobs:
            path, ids = Path(job["path"]), job["prompt"]
            model = load_model(path, **tp)
            n_layers = model.config.num_layers
            stages = [load_model(path, layer_range=(0, n_layers // 2), **tp),
                      load_model(path, layer_range=(n_layers // 2, n_layers), **tp)]
            engine = Engine(model, num_slots=2)
            greedy = engine.generate([ids], SamplingParams(temperature=0, max_tokens=job["new_tokens"]))[0]
            seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=8)
            sampled = engine.generate([ids], seeded)[0]
            layer = model.model.layers["0"]
            shard_shapes = {"q_proj": tuple(layer.self_attn.q_proj.weight.shape),
                            "o_proj": tuple(layer.self_attn.o_proj.weight.shape),
                            "embed_tokens": tuple(model.model.embed_tokens.weight.shape)}
            results.append(dict(shard_shapes=shard_shapes, logits=_logits([model], ids),
                                pipeline_logits=_logits(stages, ids), greedy=greedy, sampled=sampled))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        # Free the models and meet before tearing gloo down. Without this, one rank in about four
        # aborted at interpreter exit ("terminate called without an active exception"), after
        # both ranks had saved their results and returned from destroy_process_group.
        del model, stages, engine
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()
