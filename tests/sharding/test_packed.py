"""Packed bfloat16 weights (``sharding.packed``): the kernel against float64 matmuls, the engines
with packed weights against transformers' greedy output on the same (bfloat16-exact) checkpoints.

Skipped where the kernel cannot run (not x86-64 with AVX2, no compiler): ``unavailable_reason``.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch
from torch import nn

from sharding import packed
from sharding.engine import Engine
from sharding.sampling import SamplingParams
from sharding.speculative import SpeculativeEngine
from sharding.weights import load_model

from .conftest import hf_greedy, prompt_ids, save_random_llama

needs_kernel = pytest.mark.skipif(packed.unavailable_reason() is not None,
                                  reason=f"packed kernel unavailable: {packed.unavailable_reason()}")


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A random target and draft (same vocabulary) whose float32 weights are bfloat16 values."""
    out = tmp_path_factory.mktemp("bf16")
    pair = []
    for name, overrides in (("full", dict(num_hidden_layers=3, tie_word_embeddings=False)),
                            ("fast", dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                          intermediate_size=64, num_hidden_layers=1))):
        path = save_random_llama(out / name, **overrides)
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.bfloat16().float())
        model.save_pretrained(path)
        pair.append(path)
    return pair[0], pair[1]


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 256), (3, 256), (2, 5, 704), (16, 64), (7, 1, 3), (4, 1000), (3, 7, 64),
                                   (17, 256), (2, 31, 64), (64, 704), (5, 13, 256), (2, 100, 64)])
@pytest.mark.parametrize("out_features", [16, 704, 4096])
def test_kernel_matches_a_float64_matmul(shape, out_features):
    g = torch.Generator().manual_seed(out_features + shape[-1])
    w = torch.randn(out_features, shape[-1], generator=g).bfloat16().float()
    x = torch.randn(*shape, generator=g)
    packed.load_kernel()
    y = torch.ops.fastmode.linear_bf16w(x, packed.pack(w))
    ref = x.double() @ w.double().T
    assert y.dtype == torch.float32 and y.shape == (*shape[:-1], out_features)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("out_features", [16, 192, 4096])
def test_kernel_splits_blocks_over_threads_with_the_same_bits(out_features):
    """Built with OpenMP, the kernel splits its column blocks over torch's intra-op threads; each
    block is one thread's, so every thread count gives the same bits as one thread."""
    g = torch.Generator().manual_seed(out_features)
    w = torch.randn(out_features, 576, generator=g).bfloat16().float()
    x = torch.randn(3, 576, generator=g)
    packed.load_kernel()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.fastmode.linear_bf16w(x, packed.pack(w))
        torch.set_num_threads(2)
        two = torch.ops.fastmode.linear_bf16w(x, packed.pack(w))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.testing.assert_close(one, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_kernel_refuses_bad_operands():
    packed.load_kernel()
    w = packed.pack(torch.zeros(32, 8))
    with pytest.raises(RuntimeError, match="last dim"):
        torch.ops.fastmode.linear_bf16w(torch.zeros(2, 9), w)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.fastmode.linear_bf16w(torch.zeros(2, 8, dtype=torch.float64), w)
    with pytest.raises(RuntimeError, match="packed"):
        torch.ops.fastmode.linear_bf16w(torch.zeros(2, 8), torch.zeros(32, 8, dtype=torch.bfloat16))


def test_only_lossless_weights_pack():
    exact = torch.randn(32, 8).bfloat16().float()
    assert packed.packable(exact)
    assert not packed.packable(exact + 1e-4)  # not a bfloat16 value: packing would change results
    assert not packed.packable(exact[:24])  # 24 outputs: not whole 16-wide blocks
    assert not packed.packable(exact.double())
    p = packed.pack(exact)
    assert p.shape == (2, 8, 16) and p.dtype == torch.bfloat16
    assert torch.equal(p.float().transpose(1, 2).reshape(32, 8), exact)


def test_resolve_explains_where_the_kernel_cannot_run():
    assert packed.resolve(False) is False
    assert packed.resolve("auto", device="cuda") is False
    assert packed.resolve("auto", dtype=torch.bfloat16) is False
    with pytest.raises(packed.PackedWeightsUnavailable, match="CPU only") as e:
        packed.resolve(True, device="cuda")
    assert e.value.code == "packed_weights_unavailable"


@needs_kernel
def test_apply_packs_every_linear_and_keeps_ties(bf16_pair, tmp_path):
    full, fast = (load_model(p) for p in bf16_pair)
    keys = set(full.state_dict())
    weights = {k: v.clone() for k, v in full.state_dict().items()}
    assert packed.apply_packed_weights(full) == 3 * 7 + 1  # q k v o gate up down per layer, the head
    assert set(full.state_dict()) == keys  # the packed copies are not checkpoint tensors
    for k, v in full.state_dict().items():  # q/k/v and gate/up are views of their fused weights now
        assert torch.equal(v, weights[k]), k
    for layer in full.model.layers.values():  # one call for q k v, one for gate up, o and down packed
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn.qkv, packed.FusedLinears) and isinstance(mlp.gate_up, packed.FusedLinears)
        assert attn.q_proj.weight.data_ptr() == attn.qkv.weight.data_ptr()
        assert mlp.up_proj.weight.data_ptr() == mlp.gate_up.weight[mlp.gate_proj.weight.shape[0]:].data_ptr()
        assert type(attn.o_proj) is packed.PackedLinear and type(mlp.down_proj) is packed.PackedLinear
    packed.apply_packed_weights(fast)
    assert fast.lm_head.weight is fast.model.embed_tokens.weight  # tied stays tied
    unrounded = load_model(save_random_llama(tmp_path / "fp32"))  # float32 values, not bfloat16 ones
    assert packed.apply_packed_weights(unrounded) == 0
    assert sum(type(m) is nn.Linear for m in unrounded.modules()) == 2 * 7 + 1  # untouched


@needs_kernel
def test_packed_weights_lie_in_one_arena_in_the_order_a_step_reads_them(bf16_pair):
    model = load_model(bf16_pair[0])
    packed.apply_packed_weights(model)
    buffers = [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), torch.Tensor)]
    starts = [b.data_ptr() for b in buffers]
    assert starts == sorted(starts) and all(p % 64 == 0 for p in starts)  # module order, cache-line aligned
    for b, nxt in zip(buffers, starts[1:]):  # back to back: one stream, no gaps past the alignment
        assert b.data_ptr() + b.numel() * b.element_size() <= nxt < b.data_ptr() + b.numel() * b.element_size() + 64
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert starts[0] % packed.HUGE_PAGE == 0
    assert all(b.is_contiguous() and b.dtype == torch.bfloat16 for b in buffers)


def test_an_arena_is_zeroed_memory_of_the_sizes_asked_back_to_back_in_storages_of_their_own():
    sizes = [100, 0, packed.HUGE_PAGE + 3, 64, 1]
    parts = packed.arena(sizes)
    assert [p.numel() for p in parts] == sizes
    assert all(p.dtype == torch.uint8 and int(p.sum()) == 0 for p in parts)
    full = [p for p in parts if p.numel()]
    starts = [p.data_ptr() for p in full]
    assert all(b - a == -(-p.numel() // 64) * 64 for a, b, p in zip(starts, starts[1:], full))
    # no two share a storage (a nested compile region refuses aliased inputs), and writes stay apart
    assert len({p.untyped_storage().data_ptr() for p in full}) == len(full)
    for i, p in enumerate(full):
        p.fill_(i + 1)
    assert [int(p.max()) for p in full] == [int(p.min()) for p in full] == list(range(1, len(full) + 1))


@needs_kernel
@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.full)], ids=["eager", "compiled"])
def test_engine_greedy_matches_transformers(bf16_pair, compile):
    path = bf16_pair[0]
    engine = Engine.from_pretrained(path, num_slots=4, compile=compile, packed_weights=True)
    # decode steps of 1-4 rows; prefills of 30 rows (the kernel) and 70 (MKL's, past MAX_ROWS)
    prompts = [prompt_ids(path, n, seed=n) for n in (5, 9, 30, 70)]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    assert outs == [hf_greedy(path, p, 40) for p in prompts]


@needs_kernel
@pytest.mark.parametrize("compile_regions", [False, pytest.param(True, marks=pytest.mark.full)],
                         ids=["eager", "compiled-regions"])  # compiled: inductor's cold build, ~40 s
def test_speculative_greedy_matches_transformers(bf16_pair, compile_regions):
    """Eager, and compiled by inductor one layer for all (``compile_regions``: the exact lane's setting;
    each layer's packed weights are inputs of the region, in storages of their own)."""
    full, fast = bf16_pair
    engine = SpeculativeEngine.from_pretrained(full, fast, num_slots=2, k=3, adaptive=False, packed_weights=True,
                                               compile=compile_regions, compile_regions=compile_regions)
    prompts = [prompt_ids(full, n, seed=n) for n in (6, 11)]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    assert outs == [hf_greedy(full, p, 40) for p in prompts]
    assert engine.stats.rounds > 0


@needs_kernel
@pytest.mark.full  # a cold compile of every warm-up shape (minutes); make test compiles rings and engines on fewer shapes
def test_after_the_warm_up_no_batch_compiles_again(bf16_pair):
    # Packed weights serve steps of up to 64 rows (the kernel's MAX_ROWS) and MKL the rest, chosen
    # inside the kernel: no guard on the row count, so the warm-up's graphs serve every batch.
    from torch._dynamo.utils import counters

    from sharding.stage import warm_up

    torch._dynamo.reset()
    path = bf16_pair[0]
    engine = Engine.from_pretrained(path, num_slots=8, compile=True, prefix_cache=True, packed_weights=True)
    warm_up(engine)
    warmed = counters["stats"]["unique_graphs"]
    assert warmed > 0
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for rows in (4, 1, 5, 8, 2, 3):
        engine.generate([prompt_ids(path, 2 + r, seed=r) for r in range(rows)], params)
    for n in (40, 80):  # a prefill on the kernel, one on MKL (past MAX_ROWS)
        long = [prompt_ids(path, n, seed=n)]  # other seeds: no prefix shared
        assert engine.generate(long, params) == [hf_greedy(path, long[0], 12)]
    engine.generate([long[0] + prompt_ids(path, 3 + r, seed=r)[1:] for r in range(4)], params)
    # The end of the context, which the warm-up never reaches: one to three rows filling all but a
    # few positions, then decoding into the last bucket.
    ends = [prompt_ids(path, engine.max_len - 20 - r, seed=20 + r) for r in range(3)]
    for rows in (1, 3):
        engine.generate(ends[:rows], params)
    assert counters["stats"]["unique_graphs"] == warmed
