"""``KVCache``: keys and values preallocated per sequence slot, for the layers one model owns;
``SlotPool``: which slots are free.

A slot holds one sequence's keys and values for positions ``0 .. max_len - 1``. Slots are never
cleared: attention only reads positions at or before the query's own, and a sequence writes each
position before it reads it, so whatever a previous owner left behind is never seen.
"""

from __future__ import annotations

import torch
from torch import nn

from .errors import CacheFull, InvalidLayout

DEFAULT_MAX_LEN = 4096
"""Tokens per sequence when none is asked for and the model's context is longer (vLLM sizes
``max_model_len`` from the model too; a 131,072-token Llama 3.x context per slot would not fit)."""
DEFAULT_KV_CACHE_BYTES = 1 << 30
"""The KV cache one model (or one chip's share of it) may take when no budget is given: 1 GiB."""


def fit_max_len(config, *, num_slots: int, layers: int, kv_heads: int, dtype: torch.dtype,
                max_len: int | None = None, kv_cache_bytes: int | None = None) -> int:
    """Tokens per sequence for a cache of ``num_slots`` slots of ``layers`` layers and ``kv_heads`` heads.

    Default: the model's context (``ModelConfig.context``), at most ``DEFAULT_MAX_LEN``, at most what
    ``kv_cache_bytes`` (default ``DEFAULT_KV_CACHE_BYTES``) holds. An explicit ``max_len`` must fit both
    the context and the budget. Raises ``InvalidLayout`` naming the fields otherwise.
    """
    budget = DEFAULT_KV_CACHE_BYTES if kv_cache_bytes is None else kv_cache_bytes
    if budget < 1:
        raise InvalidLayout(f"kv_cache_bytes must be >= 1, got {budget}")
    per_position = num_slots * layers * 2 * kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
    fits = budget // per_position if per_position else config.context
    if max_len is None:
        max_len = min(config.context, DEFAULT_MAX_LEN, fits)
        if max_len < 1:
            raise InvalidLayout(f"kv_cache_bytes {budget} cannot hold one position of {num_slots} slots "
                                f"({per_position} bytes); raise kv_cache_bytes or lower num_slots")
        return max_len
    if not 1 <= max_len <= config.context:
        raise InvalidLayout(f"max_len {max_len} is not within the model's context [1, {config.context}]")
    if max_len > fits:
        raise InvalidLayout(
            f"max_len {max_len} x num_slots {num_slots} needs {max_len * per_position / 2**20:.0f} MiB of KV cache, "
            f"over kv_cache_bytes {budget / 2**20:.0f} MiB (at most max_len {fits} fits); lower max_len or "
            "num_slots, or raise kv_cache_bytes")
    return max_len


class SlotPool:
    """Which of ``num_slots`` sequence slots are free; lowest slot first.

    The engine's scheduler allocates from one pool; when the caches live on other processes
    (chip actors), they are addressed by the slot indices this pool hands out.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise InvalidLayout(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        # Lowest slot first, so a lone sequence always lands in slot 0 (handy when debugging).
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        """Slots not held by any sequence."""
        return len(self._free)

    def allocate(self) -> int:
        """Take a free slot; raises ``CacheFull`` when every slot is held."""
        if not self._free:
            raise CacheFull(f"all {self.num_slots} KV-cache slots are in use")
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        """Give ``slot`` back; freeing a slot that is not held is a bug and raises ``RuntimeError``."""
        if slot not in self._used:
            raise RuntimeError(f"KV-cache slot {slot} is not allocated")
        self._used.remove(slot)
        self._free.append(slot)
        self._free.sort(reverse=True)


class KVCache(SlotPool):
    """Per-layer keys and values: ``k``/``v`` hold ``num_layers`` tensors
    ``[num_slots, max_len, kv_heads, head_dim]`` each.

    ``num_layers`` counts the layers of this model only (a pipeline stage's cache holds its own
    layers, a tensor-parallel rank's cache its own kv heads). Layer ``j`` of the model's owned
    layers, in order, uses ``k[j]`` and ``v[j]``. One tensor per layer rather than one stacked
    tensor: ``torch.compile`` updates a whole input in place, but copies the base of a view it
    writes into (the whole cache, every step).
    """

    def __init__(self, *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, spare: int = 0) -> None:
        for name, value in (("num_slots", num_slots), ("max_len", max_len), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value < 1:
                raise InvalidLayout(f"KVCache {name} must be >= 1, got {value}")
        if num_layers < 0:
            raise InvalidLayout(f"KVCache num_layers must be >= 0, got {num_layers}")
        super().__init__(num_slots)
        # `spare` positions past max_len are never written or read: they keep every attention span
        # (at most max_len) shorter than the tensor, so a compiled step sees no span equal to it.
        shape = (num_slots, max_len + spare, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len

    @classmethod
    def for_model(cls, model: nn.Module, *, num_slots: int, max_len: int | None = None,
                  kv_cache_bytes: int | None = None, spare: int = 0) -> KVCache:
        """A cache shaped for ``model`` (a ``sharding.model.Llama``, possibly a stage or a TP rank), of
        ``max_len`` positions per slot sized by ``fit_max_len`` (default: what fits ``kv_cache_bytes``,
        up to the context and ``DEFAULT_MAX_LEN``).
        """
        cfg = model.config
        layers = list(model.model.layers.values())
        # Read the (possibly tensor-parallel) local kv head count off the attention itself.
        kv_heads = layers[0].self_attn.num_kv_heads if layers else cfg.num_kv_heads
        param = next(model.parameters())
        max_len = fit_max_len(cfg, num_slots=num_slots, layers=len(layers), kv_heads=kv_heads, dtype=param.dtype,
                              max_len=max_len, kv_cache_bytes=kv_cache_bytes)
        return cls(num_layers=len(layers), num_slots=num_slots, max_len=max_len, num_kv_heads=kv_heads,
                   head_dim=cfg.head_dim, dtype=param.dtype, device=param.device, spare=spare)
