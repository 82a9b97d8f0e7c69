"""Tensor parallelism, applied from outside: ``apply_tp`` swaps a ``Llama``'s layers for sharded ones.

Megatron layout: q/k/v and gate/up are column-parallel (each rank computes its own heads and its
own slice of the SwiGLU width, no communication), o/down are row-parallel (each rank holds the
matching input slice and the partial sums meet in one ``all_reduce``). So one decoder layer costs
two all-reduces. The embedding and the head are split by vocabulary rows: the embedding looks up
the ids it owns and all-reduces, the head computes its slice of the logits and all-gathers them.

Every sharded parameter carries ``weight_loader(param, full_tensor)`` cutting its shard out of
the full checkpoint tensor, so ``sharding.weights.load_weights`` loads any layout the same way.
The collectives sit in plain ``forward`` methods, never in hooks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .errors import CheckpointError, InvalidLayout
from .packed import linear


class _Sharded(nn.Module):
    """A weight cut along ``dim`` into ``shards`` blocks of ``ceil(full / shards)``; this rank holds block
    ``block`` (by default ``shards = tp_size``, ``block = tp_rank``). Rows past the full tensor's end
    (a vocabulary padded to a multiple of ``tp_size``) are zeros. Keys and values replicated across
    ranks (``tp_size > num_kv_heads``, as vLLM does) are ``shards = num_kv_heads``, ``block = rank //
    (tp_size / num_kv_heads)``. ``bias`` (cut the same way, or whole when ``dim`` is the input's) is
    optional."""

    def __init__(self, full_shape: tuple[int, int], dim: int, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup | None, dtype: torch.dtype, device: torch.device, *,
                 bias: bool = False, shards: int | None = None, block: int | None = None) -> None:
        super().__init__()
        self.full_shape, self.dim = tuple(full_shape), dim
        self.tp_rank, self.tp_size, self.group = tp_rank, tp_size, group
        self.shards = tp_size if shards is None else shards
        self.block = tp_rank if block is None else block
        shape = list(full_shape)
        shape[dim] = -(-shape[dim] // self.shards)
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            # Output-split: this rank's slice of the bias; input-split: the whole bias, added once.
            n = shape[0] if dim == 0 else full_shape[0]
            self.bias = nn.Parameter(torch.empty(n, dtype=dtype, device=device), requires_grad=False)
            if dim == 0:
                self.bias.weight_loader = self.bias_loader

    def _cut(self, param: nn.Parameter, full: torch.Tensor, dim: int) -> None:
        size = param.shape[dim]
        start = self.block * size
        take = max(0, min(size, full.shape[dim] - start))
        if take < size:
            param.data.zero_()
        if take:
            param.data.narrow(dim, 0, take).copy_(full.narrow(dim, start, take))

    def weight_loader(self, param: nn.Parameter, full: torch.Tensor) -> None:
        """Copy this rank's block of the full checkpoint tensor into ``param``."""
        if tuple(full.shape) != self.full_shape:
            raise CheckpointError(f"checkpoint tensor of shape {tuple(full.shape)} does not fit a "
                                  f"sharded parameter of full shape {self.full_shape}")
        self._cut(param, full, self.dim)

    def bias_loader(self, param: nn.Parameter, full: torch.Tensor) -> None:
        """Copy this rank's slice of the full bias into ``param``."""
        if tuple(full.shape) != (self.full_shape[0],):
            raise CheckpointError(f"checkpoint bias of shape {tuple(full.shape)} does not fit a sharded "
                                  f"parameter of full shape {(self.full_shape[0],)}")
        self._cut(param, full, 0)

    def extra_repr(self) -> str:
        return (f"full_shape={self.full_shape}, shard_dim={self.dim}, tp={self.tp_rank}/{self.tp_size}"
                + (f", block={self.block}/{self.shards}" if self.shards != self.tp_size else ""))


class ColumnParallelLinear(_Sharded):
    """``y = x @ W.T (+ b)`` with ``W``'s output rows split: ``[..., in] -> [..., out / tp]``, no collective."""

    def __init__(self, in_features: int, out_features: int, *, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", bias: bool = False, shards: int | None = None,
                 block: int | None = None) -> None:
        super().__init__((out_features, in_features), 0, tp_rank, tp_size, group, dtype, torch.device(device),
                         bias=bias, shards=shards, block=block)
        self.register_buffer("packed", None, persistent=False)  # set by sharding.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.packed)
        return y if self.bias is None else y + self.bias


class RowParallelLinear(_Sharded):
    """``y = x @ W.T (+ b)`` with ``W``'s input columns split: ``[..., in / tp] -> [..., out]`` + all_reduce;
    the bias is added once, after the sum."""

    def __init__(self, in_features: int, out_features: int, *, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", bias: bool = False) -> None:
        super().__init__((out_features, in_features), 1, tp_rank, tp_size, group, dtype, torch.device(device),
                         bias=bias)
        self.register_buffer("packed", None, persistent=False)  # set by sharding.packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.packed)  # partial sum over this rank's input slice
        if self.tp_size > 1:
            dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(_Sharded):
    """Embedding with vocabulary rows split (padded to a multiple of tp): look up the ids this rank
    owns, zero the rest, all_reduce."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__((num_embeddings, embedding_dim), 0, tp_rank, tp_size, group, dtype,
                         torch.device(device))
        self.vocab_start = tp_rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [B, S] -> [B, S, D]
        local = ids - self.vocab_start
        owned = (local >= 0) & (local < self.weight.shape[0])
        h = F.embedding(local.masked_fill(~owned, 0), self.weight).masked_fill(~owned[..., None], 0.0)
        if self.tp_size > 1:
            dist.all_reduce(h, group=self.group)
        return h


class ParallelLMHead(_Sharded):
    """Output head with vocabulary rows split (padded to a multiple of tp): local logits
    ``[..., ceil(V / tp)]``, all_gather, the padding cut off: ``[..., V]``."""

    def __init__(self, hidden_size: int, vocab_size: int, *, tp_rank: int, tp_size: int,
                 group: dist.ProcessGroup | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        super().__init__((vocab_size, hidden_size), 0, tp_rank, tp_size, group, dtype, torch.device(device))
        self.vocab_size = vocab_size
        self.register_buffer("packed", None, persistent=False)  # set by sharding.packed

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        local = linear(h, self.weight, self.packed).contiguous()
        if self.tp_size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        dist.all_gather(parts, local, group=self.group)
        logits = torch.cat(parts, dim=-1)
        return logits if logits.shape[-1] == self.vocab_size else logits[..., :self.vocab_size]


def check_tp(config: ModelConfig, tp_size: int) -> None:
    """Raise ``InvalidLayout`` unless ``tp_size`` splits the model: it divides the query heads and the
    MLP width, and divides the kv heads or is a multiple of them (then they are replicated). The
    vocabulary need not divide: it is padded."""
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise InvalidLayout(f"tp_size must be a positive int, got {tp_size!r}")
    sizes = {"num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size}
    bad = [f"{name}={n}" for name, n in sizes.items() if n % tp_size]
    kv = config.num_kv_heads
    if kv % tp_size and tp_size % kv:
        bad.append(f"num_key_value_heads={kv} (nor is it a multiple of them)")
    if bad:
        raise InvalidLayout(f"tensor parallel size {tp_size} does not divide {', '.join(bad)}")


def kv_heads_per_rank(config: ModelConfig, tp_size: int) -> int:
    """Key/value heads each tensor-parallel rank holds (1 when they are replicated)."""
    return max(1, config.num_kv_heads // tp_size)


def _swap(parent: nn.Module, name: str, new: _Sharded) -> None:
    """Replace ``parent.<name>`` by ``new``, carrying over this rank's shard of any materialised weight."""
    old = getattr(parent, name)
    if old.weight.device.type != "meta":
        with torch.no_grad():
            new.weight_loader(new.weight, old.weight)
            if new.bias is not None:
                getattr(new.bias, "weight_loader", lambda p, t: p.data.copy_(t))(new.bias, old.bias)
    setattr(parent, name, new)


def apply_tp(model: nn.Module, *, tp_rank: int, tp_size: int,
             group: dist.ProcessGroup | None = None) -> nn.Module:
    """Shard ``model`` (a ``sharding.model.Llama`` or stage) in place for rank ``tp_rank`` of ``tp_size``.

    Call it before ``load_weights`` (each rank then reads only its shards) or after (the loaded
    full weights are cut down). ``group`` is the tensor-parallel process group (default: WORLD).
    Raises ``InvalidLayout`` if ``tp_size`` cannot split the model (``check_tp``).
    """
    cfg = model.config
    check_tp(cfg, tp_size)
    if not 0 <= tp_rank < tp_size:
        raise InvalidLayout(f"tp_rank {tp_rank} is not in [0, {tp_size})")
    if tp_size == 1:
        return model
    ref = next(model.parameters())
    kw = dict(tp_rank=tp_rank, tp_size=tp_size, group=group, dtype=ref.dtype, device=ref.device)
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    kv = cfg.num_kv_heads
    # Replicated kv heads: rank r holds kv head r // (tp / kv), the one its query heads read.
    kv_split = {} if kv >= tp_size else dict(shards=kv, block=tp_rank // (tp_size // kv))
    for layer in model.model.layers.values():
        attn, mlp = layer.self_attn, layer.mlp
        qkv, o = dict(kw, bias=cfg.qkv_bias), dict(kw, bias=cfg.o_bias)
        _swap(attn, "q_proj", ColumnParallelLinear(d, cfg.num_heads * hd, **qkv))
        _swap(attn, "k_proj", ColumnParallelLinear(d, kv * hd, **qkv, **kv_split))
        _swap(attn, "v_proj", ColumnParallelLinear(d, kv * hd, **qkv, **kv_split))
        _swap(attn, "o_proj", RowParallelLinear(cfg.num_heads * hd, d, **o))
        attn.num_heads, attn.num_kv_heads = cfg.num_heads // tp_size, kv_heads_per_rank(cfg, tp_size)
        m = dict(kw, bias=cfg.mlp_bias)
        _swap(mlp, "gate_proj", ColumnParallelLinear(d, inter, **m))
        _swap(mlp, "up_proj", ColumnParallelLinear(d, inter, **m))
        _swap(mlp, "down_proj", RowParallelLinear(inter, d, **m))
    if model.has_embedding:
        _swap(model.model, "embed_tokens", VocabParallelEmbedding(cfg.vocab_size, d, **kw))
    if model.has_head:
        _swap(model, "lm_head", ParallelLMHead(d, cfg.vocab_size, **kw))
        if cfg.tie_word_embeddings and model.has_embedding:
            # Both split the vocabulary the same way, so the shards can stay shared.
            model.lm_head.weight = model.model.embed_tokens.weight
    model.tp_rank, model.tp_size = tp_rank, tp_size
    return model
