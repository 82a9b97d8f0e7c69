"""Load a Hugging Face safetensors checkpoint into a ``Llama``: whole, a pipeline stage, or a TP rank.

Loading walks the *model's* parameters and reads only the tensors they name, so a stage skips
the layers it does not own without special cases. A parameter with a ``weight_loader(param,
full_tensor)`` attribute (the tensor-parallel layers) cuts its own shard from the full tensor;
every other parameter is copied whole. Copies upcast (or downcast) to the parameter's dtype.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

from .config import ModelConfig
from .errors import CheckpointError
from .model import Llama
from .tp import apply_tp

TIED_HEAD = "lm_head.weight"
EMBEDDING = "model.embed_tokens.weight"


def default_weight_loader(param: torch.nn.Parameter, full: torch.Tensor) -> None:
    """Copy ``full`` into ``param`` whole (converting dtype); shapes must match."""
    if tuple(full.shape) != tuple(param.shape):
        raise CheckpointError(f"checkpoint tensor of shape {tuple(full.shape)} does not fit a "
                              f"parameter of shape {tuple(param.shape)}")
    param.data.copy_(full)


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint dir (one file, or the shards its index names)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors in {path}")
    return files


@torch.no_grad()
def load_weights(model: Llama, path: str | Path) -> None:
    """Fill every parameter of ``model`` from the checkpoint at ``path``.

    A tied checkpoint has no ``lm_head.weight``; a head that is not already sharing the
    embedding's parameter (the last pipeline stage of a tied model) loads the embedding.
    Raises ``CheckpointError`` naming the first tensor that is missing or misshapen.
    """
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
                   for f in checkpoint_files(path)]
        where = {name: h for h in handles for name in h.keys()}
        for name, param in model.named_parameters():  # a tied head shares, so appears once
            source = name
            if name == TIED_HEAD and name not in where and model.config.tie_word_embeddings:
                source = EMBEDDING
            if source not in where:
                raise CheckpointError(f"checkpoint {path} has no tensor {source!r}")
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                loader(param, where[source].get_tensor(source))
            except CheckpointError as e:
                raise CheckpointError(f"{source}: {e}") from None


def load_model(path: str | Path, *, layer_range: tuple[int, int] | None = None,
               has_embedding: bool | None = None, has_head: bool | None = None,
               tp_rank: int = 0, tp_size: int = 1, tp_group: dist.ProcessGroup | None = None,
               dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Llama:
    """Build, shard and load a model from a checkpoint dir, in that order.

    The order matters: tensor parallelism swaps layers for sharded ones before loading, so each
    rank only ever holds its own shard (plus one full tensor at a time while loading). See
    ``Llama`` for ``layer_range``/``has_embedding``/``has_head`` and ``apply_tp`` for ``tp_*``.
    """
    config = ModelConfig.from_pretrained(path)
    model = Llama(config, layer_range=layer_range, has_embedding=has_embedding, has_head=has_head,
                  dtype=dtype, device=device)
    if tp_size > 1:
        apply_tp(model, tp_rank=tp_rank, tp_size=tp_size, group=tp_group)
    load_weights(model, path)
    return model.eval()
