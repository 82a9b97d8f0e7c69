"""``preflight``: every model checked against every lane that will run it, before Ray starts.

A model the executor cannot run, a checkpoint whose tensors its config does not describe, a layout
that does not split the model, a pair whose tokenizers differ (the exact tier verifies the fast
model's drafts token by token; ``auto`` scores with the fast model's tokens) or weights that do not
fit the machine would otherwise surface minutes later, as a Serve deployment that keeps retrying.
``fastmode up`` runs these checks first and exits 2 with the first failure, naming the field.

Who runs what: the fast lane and the router's ``auto`` scorer run ``models.fast`` on fastmode's
executor; the exact lane runs both models on it (``lanes.exact.engine: fastmode``, the default) or
on vLLM; the priority and standard lanes run ``models.full`` on vLLM, which checks its own
architectures when it starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from sharding.errors import ShardingError
from sharding.placement import stage_layers
from sharding.weights import check_checkpoint

from .config import AppConfig
from .errors import ConfigError

PROBES = ("Hello, world!", "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
          "  Ünïcödé — 東京 🚀 1234567890", "<|im_start|>user\n<s>[INST]</s>\n")
"""Texts both models' tokenizers must turn into the same ids (code, whitespace, non-Latin scripts,
digits, special-token look-alikes)."""

MEMORY_SHARE = 0.9
"""The share of the machine's memory the estimate may take."""


class PreflightError(ConfigError):
    """A model that a lane of this config cannot run; the message names the field and the fix."""

    code = "preflight_failed"


def preflight(config: AppConfig, *, chips: int | None = None, memory_bytes: int | None = None) -> None:
    """Raise ``PreflightError`` naming the first model/lane pair that cannot start.

    ``chips``: the fast lane's chips (``fastmode up --chips``); ``memory_bytes``: the machine's memory
    (default: this machine's).
    """
    full, fast = config.models.full, config.models.fast
    exact_ours = config.lanes.exact.engine == "fastmode"
    fast_cfg = _check(fast.path, "models.fast.path", "the fast lane, the router's auto scorer"
                      + (" and the exact lane's drafter" if exact_ours else ""))
    full_cfg = _check(full.path, "models.full.path", "the exact lane (engine: fastmode)") if exact_ours else None
    lane = config.lanes.fast
    if lane.tp != "auto" or lane.pp != "auto":
        tp = 1 if lane.tp == "auto" else int(lane.tp)
        pp = 1 if lane.pp == "auto" else int(lane.pp)
        try:
            stage_layers(fast_cfg, tp, pp)
        except ShardingError as e:
            raise PreflightError(f"lanes.fast.tp/pp: {e} (models.fast.path: {fast.path})") from None
        if chips is not None and tp * pp * lane.replicas > chips:
            raise PreflightError(f"lanes.fast: tp={tp} x pp={pp} x replicas={lane.replicas} needs "
                                 f"{tp * pp * lane.replicas} chips; --chips gives {chips}")
        if lane.vocab not in (None, "auto") and tp > 1:
            raise PreflightError(f"lanes.fast.vocab: a cut vocabulary needs the head on one chip (tp: 1), "
                                 f"got tp: {tp} (or set lanes.fast.vocab: null)")
    if full_cfg is not None and full_cfg.vocab_size != fast_cfg.vocab_size:
        raise PreflightError(f"models.fast.path: its vocabulary ({fast_cfg.vocab_size}) is not the full model's "
                             f"({full_cfg.vocab_size}); the exact lane's drafter needs the same token ids")
    for field, setting in (("lanes.fast.vocab", lane.vocab),
                           ("lanes.exact.draft_vocab", config.lanes.exact.draft_vocab if exact_ours else None)):
        if setting not in (None, "auto"):
            from sharding.draft_vocab import ranked_ids

            try:
                ranked_ids(fast.path)
            except ShardingError as e:
                raise PreflightError(f"{field}: {e} (or set {field}: null)") from None
    _same_tokenizer(full.path, fast.path)
    _fits_memory(config, memory_bytes)


def _check(path: str, field: str, who: str):
    try:
        return check_checkpoint(path)
    except ShardingError as e:
        raise PreflightError(f"{field}: {e} (needed by {who}). Supported on fastmode's executor: llama, qwen2, "
                             "qwen3, mistral, gemma3_text/gemma3, phi3, unquantized") from None


def _same_tokenizer(full: str, fast: str) -> None:
    """The exact tier and ``auto`` need the fast model to read and write the full model's tokens."""
    from tokenizers import Tokenizer

    try:
        a, b = (Tokenizer.from_file(str(Path(p) / "tokenizer.json")) for p in (full, fast))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise PreflightError(f"models: cannot read a tokenizer.json: {e}") from None
    if a.get_vocab_size() != b.get_vocab_size():
        raise PreflightError(f"models.fast.path: its tokenizer has {b.get_vocab_size()} tokens, the full model's "
                             f"{a.get_vocab_size()}; the exact lane and auto need the same tokenizer")
    for text in PROBES:
        ids_a, ids_b = a.encode(text).ids, b.encode(text).ids
        if ids_a != ids_b:
            raise PreflightError(f"models.fast.path: its tokenizer reads {text!r} as {ids_b[:8]}..., the full "
                                 f"model's as {ids_a[:8]}...; the exact lane and auto need the same tokenizer")


def _bytes(path: str, dtype_bytes: int) -> int:
    """The model's weights in ``dtype_bytes`` per parameter (read off safetensors headers)."""
    from safetensors import safe_open

    from sharding.weights import checkpoint_files

    n = 0
    for f in checkpoint_files(path):
        with safe_open(str(f), framework="pt", device="cpu") as h:
            for name in h.keys():
                shape = h.get_slice(name).get_shape()
                count = 1
                for d in shape:
                    count *= d
                n += count
    return n * dtype_bytes


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def estimate(config: AppConfig) -> dict[str, int]:
    """Weight bytes each part of the deployment holds, per part: the fast lane (its replicas), the
    router (each gateway replica scores with the fast model, in float32), the exact lane (both
    models), the vLLM lanes (the full model per replica). KV caches are bounded apart
    (``sharding.kv_cache.DEFAULT_KV_CACHE_BYTES``, ``serve.lanes.vllm_sizing``) and not counted."""
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    full, fast = config.models.full.path, config.models.fast.path
    lanes = config.lanes
    out = {"lanes.fast": _bytes(fast, size.get(lanes.fast.dtype, 4)) * lanes.fast.replicas,
           "router": _bytes(fast, 4)}
    for name in ("priority", "standard"):
        lane = getattr(lanes, name)
        out[f"lanes.{name}"] = _bytes(full, size.get(lane.dtype, 4)) * lane.replicas
    ex = lanes.exact
    out["lanes.exact"] = (_bytes(full, size.get(ex.dtype, 4)) + _bytes(fast, size.get(ex.dtype, 4))) * ex.replicas
    return out


def _fits_memory(config: AppConfig, memory_bytes: int | None) -> None:
    memory = machine_memory() if memory_bytes is None else memory_bytes
    parts = estimate(config)
    total = sum(parts.values())
    if total > MEMORY_SHARE * memory:
        biggest = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
        raise PreflightError(f"models: the weights alone take {total / 2**30:.1f} GiB ({biggest}) of this "
                             f"machine's {memory / 2**30:.1f} GiB; use smaller models, bfloat16 (lanes.*.dtype), "
                             "or fewer replicas")

