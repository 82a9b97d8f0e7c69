"""Packed bfloat16 weights for decode: ``apply_packed_weights(model)``, applied from outside.

A decode step (or a speculative verify step) multiplies a few rows by every weight of the model
once, so on a CPU it streams the weights from memory and waits on bandwidth, not arithmetic: the
full model's float32 weights (30 MiB) overflow this machine's 32 MiB L3 together with the draft
model and the KV cache. ``fastmode::linear_bf16w`` (``csrc/linear_bf16w.cpp``, AVX2 + FMA) reads
the weights as bfloat16 and computes in float32, so each step streams half the bytes.

It changes no result bit that matters: every checkpoint fastmode ships is stored in bfloat16, so
its float32 weights are exactly bfloat16 values and the products are the same; only the order of
the float32 sums differs from MKL's (as it differs between MKL's own kernels). A weight that is
not exactly representable is never packed (``packable``), so packing is lossless by construction.

``apply_packed_weights`` swaps each ``nn.Linear`` for a ``PackedLinear`` and gives each
tensor-parallel linear (``sharding.tp``) a ``packed`` buffer. Linears that read the same input (an
attention layer's q, k and v; an MLP's gate and up) become one ``FusedLinears``: one kernel call
whose output is split, instead of one call per linear (a decode step's calls are short, so their
fixed cost counts), with the linears' parameters turned into views of the fused weight. Both keep the float32 weight: a step
of more than 64 rows (the kernel's ``MAX_ROWS``; a long prefill) runs MKL's ``F.linear`` as before.
Up to 64 rows the kernel is also the faster one for prefills (a conversation's next turn): 0.60x
MKL's time at 20 rows, 0.80x at 64 (``python -m bench.packed_rows``; docs/sharding.md).

The kernel is compiled on first use (about 15 s, ``torch.utils.cpp_extension``; cached under
``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) and needs x86-64 with AVX2 and
FMA, a C++ compiler and ninja. ``unavailable_reason()`` says what is missing. The same library holds
``fastmode::cached_attention`` (``sharding.cached_attention``), which packing switches on with it.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import platform
import shutil
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ShardingError

__all__ = ["FusedLinears", "PackedLinear", "PackedWeightsUnavailable", "apply_packed_weights", "linear",
           "load_kernel", "pack", "packable", "resolve", "unavailable_reason"]

log = logging.getLogger(__name__)

BLOCK = 16
"""Output columns per packed block: a weight's output size must be a multiple of it."""
HUGE_PAGE = 2 << 20
"""Linux's transparent huge page (x86-64): the arena of packed weights starts on one (``arena``)."""

_SOURCES = [Path(__file__).parent / "csrc" / name for name in ("linear_bf16w.cpp", "cached_attention.cpp")]
"""fastmode's CPU kernels, built into one library (``load_kernel``)."""
_lock = threading.Lock()
_loaded = False


class PackedWeightsUnavailable(ShardingError):
    """Packed weights were asked for where the kernel cannot run or could not be built."""

    code = "packed_weights_unavailable"


def unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """Why the packed kernel cannot serve a model on ``device`` here, or ``None`` if it can."""
    if torch.device(device).type != "cpu":
        return f"the packed kernel runs on CPU only, not {torch.device(device).type}"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the packed kernel needs x86-64 (AVX2), this machine is {platform.machine()}"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"the packed kernel needs AVX2 and FMA; torch reports CPU capability {capability}"
    if not _loaded:
        from torch.utils import cpp_extension

        if not cpp_extension.is_ninja_available():
            return "building the packed kernel needs ninja (pip install ninja)"
        if not (shutil.which("c++") or shutil.which("g++")):
            return "building the packed kernel needs a C++ compiler (c++ or g++ on PATH)"
    return None


def load_kernel() -> None:
    """Build (first time on this machine) and load ``fastmode::linear_bf16w`` and
    ``fastmode::cached_attention`` into this process.

    Raises:
        PackedWeightsUnavailable: the kernel cannot run here, or its build failed (with the reason).
    """
    global _loaded
    with _lock:
        if _loaded:
            return
        reason = unavailable_reason()
        if reason:
            raise PackedWeightsUnavailable(reason)
        from torch.utils import cpp_extension
        flags = ["-O3", "-mavx2", "-mfma", "-fopenmp"]  # -fopenmp: at::parallel_for splits blocks over threads
        code = b"".join(source.read_bytes() for source in _SOURCES)
        tag = hashlib.sha256(code + torch.__version__.encode() + " ".join(flags).encode()).hexdigest()[:12]
        try:  # cpp_extension locks its build folder: concurrent processes build once
            cpp_extension.load(name=f"fastmode_cpu_kernels_{tag}", sources=[str(s) for s in _SOURCES],
                               extra_cflags=flags, is_python_module=False, verbose=False)
        except Exception as e:  # noqa: BLE001 - the compiler's own message is the useful part
            raise PackedWeightsUnavailable(f"building the packed kernel failed: {e}") from e
        torch.library.register_fake("fastmode::linear_bf16w")(_linear_bf16w_shape)
        torch.library.register_fake("fastmode::cached_attention")(_cached_attention_shape)
        _loaded = True


def _linear_bf16w_shape(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0] * packed.shape[2])


def _cached_attention_shape(q: torch.Tensor, *args) -> torch.Tensor:
    return q.new_empty(q.shape)


def resolve(setting: bool | str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> bool:
    """A config's ``packed_weights`` (``true``, ``false`` or ``"auto"``) as a decision for this process.

    ``"auto"``: on where the kernel runs (a float32 model on an AVX2 CPU), else off with the
    reason logged. ``True`` where it cannot run raises ``PackedWeightsUnavailable``.
    """
    if setting is False:
        return False
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        reason = unavailable_reason(device) or f"packed weights serve float32 models, not {dtype}"
    else:
        try:  # load_kernel checks the machine itself (unavailable_reason) before building
            load_kernel()
            return True
        except PackedWeightsUnavailable as e:
            reason = str(e)
    if setting == "auto":
        log.info("packed weights off: %s", reason)
        return False
    raise PackedWeightsUnavailable(reason)


def packable(weight: torch.Tensor) -> bool:
    """Whether ``weight`` ``[N, K]`` packs losslessly: float32, ``N % BLOCK == 0``, every value a bfloat16."""
    return (weight.dim() == 2 and weight.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.shape[0] % BLOCK == 0 and weight.shape[0] > 0
            and torch.equal(weight, weight.to(torch.bfloat16).to(torch.float32)))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[N, K]`` as the kernel reads it: bfloat16 ``[N / BLOCK, K, BLOCK]``, contiguous."""
    n, k = weight.shape
    return weight.detach().to(torch.bfloat16).view(n // BLOCK, BLOCK, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T``: from ``packed`` alone where it is set (``weight`` is not passed: one graph
    input fewer per linear in a compiled step), the kernel's own loop for a step of at most 64 rows,
    else MKL on the weights unpacked for the call.

    The kernel makes that choice itself: a branch on the row count here would make
    ``torch.compile`` guard on it and compile each dynamic graph twice (34 graphs against 24 for the
    speculative engine, 130 s of warm-up against 80 here).
    """
    if packed is None:
        return F.linear(x, weight)
    return torch.ops.fastmode.linear_bf16w(x, packed)


class PackedLinear(nn.Module):
    """A bias-free ``nn.Linear`` that also holds its weight packed (``pack``) for small steps."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight  # the same Parameter (a tied embedding stays tied)
        self.register_buffer("packed", pack(weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.packed)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, packed=bfloat16"


class FusedLinears(nn.Module):
    """Bias-free linears of one input as one packed call: ``x @ cat(weights).T``, split per linear.

    The linears keep their parameters (checkpoint names and loading are unchanged) as views of the
    fused weight, so nothing is stored twice; the model calls this module instead of them.
    """

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        fused = torch.cat([m.weight.data for m in linears])
        self.sizes = [m.weight.shape[0] for m in linears]
        for m, part in zip(linears, fused.split(self.sizes), strict=True):
            m.weight.data = part
        self.register_buffer("weight", fused, persistent=False)
        self.register_buffer("packed", pack(fused), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return linear(x, self.weight, self.packed).split(self.sizes, dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.sizes}, packed=bfloat16"


FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
"""A model module's attribute that runs fused, and the linears it fuses (``sharding.model``)."""


def _fuse(model: nn.Module) -> set[int]:
    """Fuse every group of ``FUSED`` whose linears are all plain, bias-free and packable; the ids of those linears."""
    fused: set[int] = set()
    for module in model.modules():
        for attr, names in FUSED.items():
            linears = [getattr(module, name, None) for name in names]
            if hasattr(module, attr) and all(type(m) is nn.Linear and m.bias is None and packable(m.weight.data)
                                             for m in linears):
                setattr(module, attr, FusedLinears(linears))
                fused.update(id(m) for m in linears)
    return fused


def apply_packed_weights(model: nn.Module) -> int:
    """Pack every packable linear of ``model`` in place; returns how many were packed.

    Apply it after the weights are loaded and before ``torch.compile``. Bias-carrying or
    non-packable linears (``packable``) keep running in float32 as they were.

    Raises:
        PackedWeightsUnavailable: the kernel cannot run here (``load_kernel``).
    """
    load_kernel()
    fused = _fuse(model)
    count = len(fused) + _pack_unfused(model, fused)
    _into_one_arena(model)
    return count


def _pack_unfused(model: nn.Module, fused: set[int]) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in fused or isinstance(child, FusedLinears):
                continue
            if type(child) is nn.Linear and child.bias is None and packable(child.weight.data):
                setattr(parent, name, PackedLinear(child.weight))
                count += 1
            elif hasattr(child, "packed") and not isinstance(child, PackedLinear) and packable(child.weight.data):
                child.register_buffer("packed", pack(child.weight), persistent=False)
                count += 1
    return count


def arena(sizes: list[int], align: int = 64) -> list[torch.Tensor]:
    """Zeroed uint8 tensors of ``sizes`` bytes, back to back in one mapping (each starting on an
    ``align``-byte boundary, the first on a 2 MiB one), advised for transparent huge pages (Linux;
    elsewhere plain memory).

    A decode step streams every packed weight once: from 4 KiB pages that is a TLB miss every
    4 KiB, from 2 MiB pages one every 2 MiB (docs/decisions/030-packed-weights-on-huge-pages.md).
    Only 2 MiB-aligned extents of a mapping can be huge pages, hence one arena for all of a model's
    weights, not one each. Where THP is ``never`` the advice does nothing and the memory is ordinary.

    Each tensor has a storage of its own over its part of the mapping, not a view of one storage:
    a nested compile region (``sharding.stage.compile_forward``'s ``regions``) refuses inputs that
    share a storage, and a layer's packed weights are its inputs."""
    starts, end = [], 0
    for n in sizes:
        starts.append(end)
        end += -(-n // align) * align
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is None:
        memory, base = bytearray(end), 0
    else:
        memory = mmap.mmap(-1, end + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        memory.madvise(advise)  # before first touch: the pages are allocated as huge ones when written
        base = -torch.frombuffer(memory, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE
    # each tensor keeps the mapping alive as long as it lives
    return [torch.frombuffer(memory, dtype=torch.uint8, count=n, offset=base + start) if n
            else torch.zeros(0, dtype=torch.uint8) for n, start in zip(sizes, starts, strict=True)]


def _into_one_arena(model: nn.Module) -> None:
    """Move every ``packed`` buffer of ``model`` into one ``arena``, in module order (the order a
    step reads them in), each on a 64-byte boundary (a cache line)."""
    owners = [m for m in model.modules() if isinstance(getattr(m, "packed", None), torch.Tensor)
              and m.packed.device.type == "cpu"]
    if not owners:
        return
    memory = arena([m.packed.numel() * m.packed.element_size() for m in owners])
    for m, part in zip(owners, memory, strict=True):
        old = m.packed
        new = part.view(old.dtype).view(old.shape)
        new.copy_(old)
        m.register_buffer("packed", new, persistent=False)
