"""The KV cache read in place by one kernel per layer: ``use_cached_attention(model)``, applied from outside.

Without it, each layer's attention gathers its rows' cache spans into new tensors
(``index_select``), and SDPA attends under an additive ``[B, 1, S, span]`` mask built once per step.
``fastmode::cached_attention`` (``csrc/cached_attention.cpp``, AVX2 + FMA, float32) computes the same
softmax attention straight from the cache: for each query at position ``p`` the keys at positions
``j <= p`` (and ``j > p - sliding_window`` in a sliding layer) of the row's slot, with grouped-query
heads mapped as transformers maps them. Masked positions are skipped, not added as ``-inf``.

A decode step's attention is a few thousand multiply-adds per head: on CPU the gathers, the mask and
SDPA's own set-up cost more than the arithmetic, for every layer of every step. The kernel is one
call that reads each cached key and value once.

It lives in the packed kernel's library (``sharding.packed.load_kernel``) and runs where that runs:
``StageRunner`` switches it on with ``packed_weights`` (a float32 model on an x86-64 CPU with AVX2).
"""

from __future__ import annotations

import torch
from torch import nn

from .model import Attention, Llama
from .packed import load_kernel

__all__ = ["cached_attention", "use_cached_attention"]


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor, span: int, window: int, scale: float) -> torch.Tensor:
    """Attention of ``q`` ``[B, S, H, hd]`` over the cached keys and values of each row's slot.

    Args:
        q: the step's queries after RoPE (float32).
        k_cache, v_cache: one layer's cache ``[num_slots, max_len, kv_heads, hd]`` (float32,
            contiguous), holding this step's keys and values already.
        slots: ``[B]``, each row's slot; positions: ``[B, S]``, each query's position.
        span: only cache positions ``< span`` are read.
        window: a sliding layer's window (keys ``> p - window``), or 0 for full attention.
        scale: the scores' factor (``head_dim ** -0.5`` unless the config says otherwise).

    Returns:
        ``[B, S, H, hd]`` float32.
    """
    return torch.ops.fastmode.cached_attention(q, k_cache, v_cache, slots, positions, span, window, scale)


def use_cached_attention(model: nn.Module) -> int:
    """Switch every attention layer of ``model`` to ``cached_attention``; returns how many.

    Apply it before ``torch.compile`` (the graphs capture the kernel) to a float32 model on CPU.

    Raises:
        PackedWeightsUnavailable: the kernels cannot run here (``sharding.packed.load_kernel``).
    """
    load_kernel()
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for attention in layers:
        attention.kernel = cached_attention
    for llama in (m for m in model.modules() if isinstance(m, Llama)):
        llama.needs_masks = False  # every layer of it now attends through the kernel
    return len(layers)
