"""Load a Hugging Face safetensors checkpoint into a ``Llama``: whole, a pipeline stage, or a TP rank.

Loading is strict: every tensor of the checkpoint is one the whole model reads (else
``CheckpointError`` names it), every parameter finds its tensor, and shapes match. Phi-3's fused
``qkv_proj``/``gate_up_proj`` are cut into the model's q/k/v and gate/up rows here, and a ``gemma3``
checkpoint's language model is found under its prefix (its vision tower is not loaded).

Loading walks the *model's* parameters and reads only the tensors they name, so a stage skips
the layers it does not own without special cases. A parameter with a ``weight_loader(param,
full_tensor)`` attribute (the tensor-parallel layers) cuts its own shard from the full tensor;
every other parameter is copied whole. Copies upcast (or downcast) to the parameter's dtype.
"""

from __future__ import annotations

import json
import re
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


IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
"""Checkpoint tensors no model uses (old transformers saved RoPE's frequencies)."""
MULTIMODAL = re.compile(r"^(model\.)?(vision_tower|vision_model|multi_modal_projector)\.")
"""A multimodal checkpoint's non-text towers (``gemma3``), which the text decoder does not load."""


def _sources(config: ModelConfig, name: str) -> list[tuple[str, int, int] | tuple[str, None, None]]:
    """Where parameter ``name`` comes from: candidate ``(checkpoint name, row start, rows)``, the first
    present one wins; rows ``None``: the whole tensor."""
    candidates = [name]
    if config.checkpoint_prefix:  # gemma3: transformers 5 writes model.language_model.*, 4 language_model.model.*
        rest = name.removeprefix("model.")
        if name.startswith("model."):
            candidates = [f"model.language_model.{rest}", f"language_model.model.{rest}", name]
        else:
            candidates = [name, f"language_model.{name}"]
    if config.fused_projections:  # Phi-3: q/k/v rows of qkv_proj, gate/up rows of gate_up_proj
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        rows = {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv), "v_proj": ("qkv_proj", q + kv, kv),
                "gate_proj": ("gate_up_proj", 0, config.intermediate_size),
                "up_proj": ("gate_up_proj", config.intermediate_size, config.intermediate_size)}
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in rows:
            fused, start, n = rows[parts[-2]]
            return [(".".join(parts[:-2] + [fused, parts[-1]]), start, n)]
    return [(c, None, None) for c in candidates]


def expected_tensors(config: ModelConfig) -> set[str]:
    """Every checkpoint tensor name the whole model reads (of a checkpoint laid out as transformers saves
    one), so a load can fail on any tensor nothing would read."""
    whole = Llama(config, device="meta")
    names = set()
    for name, _ in whole.named_parameters(remove_duplicate=False):
        names.update(c for c, _, _ in _sources(config, name))
    return names


def unused_tensors(config: ModelConfig, names) -> list[str]:
    """The checkpoint tensor ``names`` no part of the whole model reads, sorted (RoPE tables that old
    checkpoints saved, and a multimodal checkpoint's other towers, are not counted)."""
    known = expected_tensors(config)
    if config.tie_word_embeddings:
        known |= {c for c, _, _ in _sources(config, TIED_HEAD)}
    return sorted(n for n in names if n not in known and not IGNORED.search(n)
                  and not (config.checkpoint_prefix and MULTIMODAL.search(n)))


@torch.no_grad()
def load_weights(model: Llama, path: str | Path, *, strict: bool = True) -> None:
    """Fill every parameter of ``model`` from the checkpoint at ``path``.

    A tied checkpoint has no ``lm_head.weight``; a head that is not already sharing the
    embedding's parameter (the last pipeline stage of a tied model) loads the embedding.
    Raises ``CheckpointError`` naming the first tensor that is missing or misshapen and, with
    ``strict``, any checkpoint tensor that no part of the whole model would read (a config that
    does not describe its checkpoint: such a model would load and generate garbage).
    """
    config = model.config
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
                   for f in checkpoint_files(path)]
        where = {name: h for h in handles for name in h.keys()}
        if strict:
            unused = unused_tensors(config, where)
            if unused:
                more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
                raise CheckpointError(
                    f"checkpoint {path} holds tensors a {config.model_type} model of this config.json does not "
                    f"use: {', '.join(map(repr, unused[:3]))}{more}; the config does not describe these weights "
                    "(wrong model_type, or a layer/bias setting that differs)")
        for name, param in model.named_parameters():  # a tied head shares, so appears once
            sources = _sources(config, name)
            if name == TIED_HEAD and config.tie_word_embeddings and not any(c in where for c, _, _ in sources):
                sources = _sources(config, EMBEDDING)
            found = next((src for src in sources if src[0] in where), None)
            if found is None:
                raise CheckpointError(f"checkpoint {path} has no tensor {sources[0][0]!r}")
            source, start, rows = found
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                full = where[source].get_tensor(source)
                if rows is not None:
                    if full.shape[0] < start + rows:
                        raise CheckpointError(f"fused tensor of shape {tuple(full.shape)} has no rows "
                                              f"{start}..{start + rows}")
                    full = full.narrow(0, start, rows)
                loader(param, full)
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


def check_checkpoint(path: str | Path) -> ModelConfig:
    """Check the checkpoint at ``path`` the way ``load_model`` would load it, without reading a weight:
    its config is one the executor runs, every tensor it holds is read by the model, every tensor the
    model needs is there with its shape. Returns the config; raises ``InvalidConfig`` or
    ``CheckpointError`` naming the field or tensor."""
    config = ModelConfig.from_pretrained(path)
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu"))
                   for f in checkpoint_files(path)]
        shapes = {name: tuple(h.get_slice(name).get_shape()) for h in handles for name in h.keys()}
    unused = unused_tensors(config, shapes)
    if unused:
        raise CheckpointError(f"checkpoint {path} holds tensors a {config.model_type} model of this config.json "
                              f"does not use: {', '.join(map(repr, unused[:3]))}")
    whole = Llama(config, device="meta")
    for name, param in whole.named_parameters():
        sources = _sources(config, name)
        if name == TIED_HEAD and config.tie_word_embeddings and not any(c in shapes for c, _, _ in sources):
            sources = _sources(config, EMBEDDING)
        found = next((src for src in sources if src[0] in shapes), None)
        if found is None:
            raise CheckpointError(f"checkpoint {path} has no tensor {sources[0][0]!r}")
        source, start, rows = found
        shape = shapes[source]
        if rows is not None:
            shape = (rows,) + shape[1:] if shape[0] >= start + rows else shape
        if shape != tuple(param.shape):
            raise CheckpointError(f"{source}: checkpoint tensor of shape {shape} does not fit the config's "
                                  f"{tuple(param.shape)} (config.json and weights disagree)")
    return config
