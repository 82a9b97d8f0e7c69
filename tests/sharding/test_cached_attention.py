"""``fastmode::cached_attention`` (``sharding.cached_attention``): the kernel against float64
softmax attention over the gathered cache, and every family's engines with it against transformers.

Skipped where the kernels cannot run (not x86-64 with AVX2, no compiler): ``packed.unavailable_reason``.
"""

from __future__ import annotations

import pytest
import torch

from sharding import packed
from sharding.cached_attention import cached_attention, use_cached_attention
from sharding.engine import Engine
from sharding.model import Attention
from sharding.sampling import SamplingParams
from sharding.speculative import SpeculativeEngine
from sharding.weights import load_model

from .families import FAMILIES
from .test_families import family_dir, hf_greedy, ids_of  # noqa: F401 - family_dir is a fixture

needs_kernel = pytest.mark.skipif(packed.unavailable_reason() is not None,
                                  reason=f"CPU kernels unavailable: {packed.unavailable_reason()}")


def reference(q, k_cache, v_cache, slots, positions, span, window, scale):
    """Softmax attention in float64 over each row's gathered span, masked as ``Llama.forward`` masks."""
    B, S, H, D = q.shape
    kv = k_cache.shape[2]
    keys = k_cache[slots, :span].double().repeat_interleave(H // kv, dim=2)  # [B, span, H, D]
    values = v_cache[slots, :span].double().repeat_interleave(H // kv, dim=2)
    scores = torch.einsum("bshd,bjhd->bhsj", q.double(), keys) * scale
    j = torch.arange(span)
    visible = j <= positions[:, :, None]  # [B, S, span]
    if window:
        visible &= j > positions[:, :, None] - window
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return torch.einsum("bhsj,bjhd->bshd", scores.softmax(-1), values)


@needs_kernel
@pytest.mark.parametrize("B, S, H, kv, D", [(1, 1, 9, 3, 64), (3, 1, 4, 4, 16), (2, 5, 8, 1, 64), (4, 1, 2, 1, 80),
                                             (2, 17, 4, 2, 12), (1, 40, 6, 2, 128)])
@pytest.mark.parametrize("window", [0, 5])
def test_kernel_matches_float64_attention(B, S, H, kv, D, window):
    g = torch.Generator().manual_seed(B * 1000 + S * 10 + D)
    num_slots, max_len = 6, 200
    k_cache, v_cache = (torch.randn(num_slots, max_len, kv, D, generator=g) for _ in range(2))
    slots = torch.randperm(num_slots, generator=g)[:B]
    start = torch.randint(0, 120, (B, 1), generator=g)
    positions = start + torch.arange(S)  # each row: S consecutive positions (a prefill, a verify, a decode)
    span = int(positions.max()) + 1 + int(torch.randint(0, 40, (1,), generator=g))
    q = torch.randn(B, S, H, D, generator=g)
    packed.load_kernel()
    out = cached_attention(q, k_cache, v_cache, slots, positions, span, window, D ** -0.5)
    assert out.shape == (B, S, H, D) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(q, k_cache, v_cache, slots, positions, span, window, D ** -0.5),
                               rtol=1e-5, atol=1e-5)


@needs_kernel
def test_kernel_reads_queries_of_any_layout_and_ignores_keys_past_the_span():
    packed.load_kernel()
    g = torch.Generator().manual_seed(7)
    k_cache, v_cache = (torch.randn(2, 64, 2, 16, generator=g) for _ in range(2))
    q = torch.randn(1, 4, 3, 16, generator=g).transpose(1, 2)  # [1, 3, 4, 16], not contiguous
    slots, positions = torch.tensor([1]), torch.tensor([[5, 6, 7]])
    out = cached_attention(q, k_cache, v_cache, slots, positions, 8, 0, 0.25)
    poked_k, poked_v = k_cache.clone(), v_cache.clone()
    poked_k[:, 8:], poked_v[:, 8:] = 1e6, 1e6  # beyond the span: never read
    poked_k[0], poked_v[0] = 1e6, 1e6  # another slot: never read
    assert torch.equal(out, cached_attention(q, poked_k, poked_v, slots, positions, 8, 0, 0.25))
    torch.testing.assert_close(out.double(), reference(q, k_cache, v_cache, slots, positions, 8, 0, 0.25),
                               rtol=1e-5, atol=1e-5)


@needs_kernel
def test_kernel_refuses_bad_operands():
    packed.load_kernel()
    k = torch.zeros(2, 16, 2, 8)
    q, slots, positions = torch.zeros(1, 1, 4, 8), torch.tensor([0]), torch.tensor([[3]])
    with pytest.raises(RuntimeError, match="float32"):
        cached_attention(q.double(), k, k, slots, positions, 4, 0, 1.0)
    with pytest.raises(RuntimeError, match="do not group"):
        cached_attention(torch.zeros(1, 1, 3, 8), k, k, slots, positions, 4, 0, 1.0)
    with pytest.raises(RuntimeError, match="head_dim"):
        cached_attention(torch.zeros(1, 1, 4, 4), k, k, slots, positions, 4, 0, 1.0)
    with pytest.raises(RuntimeError, match="span"):
        cached_attention(q, k, k, slots, positions, 17, 0, 1.0)
    with pytest.raises(RuntimeError, match="slot 2 out of range"):
        cached_attention(q, k, k, torch.tensor([2]), positions, 4, 0, 1.0)
    with pytest.raises(RuntimeError, match="positions"):
        cached_attention(q, k, k, slots, torch.tensor([3]), 4, 0, 1.0)


@needs_kernel
def test_use_switches_every_attention_layer(family_dir):
    model = load_model(family_dir / "gemma3_text")
    assert use_cached_attention(model) == 3
    assert all(m.kernel is cached_attention for m in model.modules() if isinstance(m, Attention))


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES)
def test_engines_with_the_kernel_are_transformers_greedy(family_dir, family):
    """Every family (Mistral's and Gemma 3's sliding windows included) with the CPU kernels on: prompt
    prefills, decode steps over growing spans and the exact tier's verify steps read the cache in place.
    These random float32 weights are not bfloat16 values, so no linear packs: only attention changes."""
    full, draft = family_dir / family, family_dir / f"{family}-draft"
    prompts = [ids_of(12, seed=1), ids_of(30, seed=2), ids_of(3, seed=3)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine = Engine.from_pretrained(full, num_slots=3, packed_weights=True)
    assert engine.executor.runner.cached_attention_layers == engine.executor.runner.model.config.num_layers
    expected = [hf_greedy(full, p, 24) for p in prompts]  # within Phi-3's original context (64)
    assert engine.generate(prompts, params) == expected
    exact = SpeculativeEngine.from_pretrained(full, draft, num_slots=3, k=3, adaptive=False, packed_weights=True)
    assert exact.generate(prompts, params) == expected
