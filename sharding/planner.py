"""``fastmode plan``: choose tp x pp for a model on a kind of chip, and predict its decode speed.

The model of one decode step for one user (batch 1), the regime of a fast lane:
- each chip of a stage reads its weight shard once per token: ``shard bytes / bandwidth``, where
  the bandwidth is the fast-memory one when the chip's whole shard (weights plus one user's KV
  cache at full context) fits in fast memory, else the main-memory one; plus a fixed
  ``layer_overhead`` per layer (dispatch and kernel launches, which dominate tiny models);
- tensor parallel adds two all-reduces per layer and one gather of the logits, each
  ``collective_latency + bytes / link_bandwidth``;
- the ring (``sharding.ring``): with ``pp > 1`` every token crosses ``pp`` hops, each
  ``link_latency + bytes / link_bandwidth``: ``pp - 1`` between stages with one token's activations,
  and the sampled token from the last stage back to the head; one stage samples itself (no hop).
  Stages run one after another for a single user.

Choice: among layouts whose shards fit every chip's memory, prefer those that fit fast memory,
then the highest predicted tokens/s, then fewer chips.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .chips import ChipSpec, ChipSpecError, load_chip, preset_names

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(ValueError):
    """No layout fits, or the inputs are unusable."""

    code = "invalid_layout"


@dataclass(frozen=True)
class Footprint:
    """Parameter counts of a Llama config, as the planner needs them."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    max_positions: int
    dtype_bytes: int

    @classmethod
    def from_config(cls, config: dict, dtype: str | None = None) -> "Footprint":
        dtype = dtype or config.get("torch_dtype") or config.get("dtype") or "float32"
        if dtype not in DTYPE_BYTES:
            raise PlanError(f"unsupported dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
        heads = config["num_attention_heads"]
        return cls(
            vocab=config["vocab_size"], hidden=config["hidden_size"], layers=config["num_hidden_layers"],
            heads=heads, kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"], tied=bool(config.get("tie_word_embeddings", False)),
            max_positions=config["max_position_embeddings"], dtype_bytes=DTYPE_BYTES[dtype],
        )

    def layer_params(self, tp: int) -> float:
        """Parameters of one decoder layer held by one of ``tp`` chips (norms replicated)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return (attn + mlp) / tp + 2 * self.hidden


@dataclass
class Layout:
    """One candidate and its prediction."""

    tp: int
    pp: int
    chips: int
    max_chip_bytes: float
    """Largest per-chip footprint (weights plus one user's KV cache at full context)."""
    fits_memory: bool
    fits_fast_memory: bool
    compute_s: float
    """Per token: weight streaming and per-layer overhead, summed over stages."""
    collective_s: float
    """Per token: tensor-parallel all-reduces and the logits gather."""
    hop_s: float
    """Per token: the ring's hops (stage to stage, and the last stage's token back to the head)."""
    tokens_per_s: float


def valid_layouts(fp: Footprint, chips: int) -> list[tuple[int, int]]:
    """Every (tp, pp) with tp * pp <= chips that the executor can run (the rules of ``sharding.tp.check_tp``
    and ``sharding.placement.stage_layers``): tp divides the heads and the MLP width and divides the kv
    heads or is a multiple of them (replicated); every stage has a layer (uneven splits allowed)."""
    out = []
    for tp in range(1, chips + 1):
        if fp.heads % tp or fp.intermediate % tp or (fp.kv_heads % tp and tp % fp.kv_heads):
            continue
        for pp in range(1, min(chips // tp, fp.layers) + 1):
            out.append((tp, pp))
    return out


def predict(fp: Footprint, chip: ChipSpec, tp: int, pp: int) -> Layout:
    """Predicted per-user decode speed of ``fp`` laid out tp x pp on ``chip``s."""
    b = fp.dtype_bytes
    per_stage_layers = -(-fp.layers // pp)  # the largest stage of an uneven split
    layer_bytes = fp.layer_params(tp) * b
    kv_bytes = per_stage_layers * 2 * max(1, fp.kv_heads // tp) * fp.head_dim * fp.max_positions * b
    table_bytes = -(-fp.vocab // tp) * fp.hidden * b
    compute, chip_bytes = 0.0, []
    for stage in range(pp):
        first, last = stage == 0, stage == pp - 1
        held = per_stage_layers * layer_bytes + kv_bytes
        read = per_stage_layers * layer_bytes  # KV read per token is tiny next to weights at batch 1
        if first:
            held += table_bytes  # the embedding: only one row is read per token
        if last:
            held += fp.hidden * b + (0 if (fp.tied and pp == 1) else table_bytes)
            read += table_bytes
        chip_bytes.append(held)
        fast = held <= chip.fast_memory_bytes
        compute += read / (chip.fast_memory_bandwidth if fast else chip.memory_bandwidth)
        compute += per_stage_layers * chip.layer_overhead
    collective = 0.0
    if tp > 1:
        act = fp.hidden * b
        per = chip.link_latency_collective + 2 * (tp - 1) / tp * act / chip.link_bandwidth
        collective = 2 * fp.layers * per + chip.link_latency_collective + fp.vocab * b / chip.link_bandwidth
    # The ring (sharding.ring): pp - 1 stage-to-stage hops of one token's activations, and the last
    # stage's token back to the head; none with one stage (the head samples itself).
    hops = (pp if pp > 1 else 0) * chip.link_latency + (pp - 1) * fp.hidden * b / chip.link_bandwidth
    total = compute + collective + hops
    return Layout(tp, pp, tp * pp, max(chip_bytes), all(c <= chip.memory_bytes for c in chip_bytes),
                  all(c <= chip.fast_memory_bytes for c in chip_bytes), compute, collective, hops,
                  1.0 / total if total > 0 else math.inf)


def plan(config: dict, chip: ChipSpec, chips: int, dtype: str | None = None, *, tp: int | None = None,
         pp: int | None = None) -> tuple[Layout, list[Layout]]:
    """(chosen layout, every candidate) for ``config`` on up to ``chips`` chips; ``tp`` or ``pp``
    given: only layouts with that value."""
    if chips < 1:
        raise PlanError(f"--chips must be at least 1, got {chips}")
    fp = Footprint.from_config(config, dtype)
    candidates = [predict(fp, chip, t, p) for t, p in valid_layouts(fp, chips)
                  if tp in (None, t) and pp in (None, p)]
    if not candidates:
        raise PlanError(f"no valid layout with tp={tp or 'any'}, pp={pp or 'any'} on {chips} chip(s) for "
                        f"this model (tp must divide its heads and width, pp its layers)")
    fitting = [c for c in candidates if c.fits_memory]
    if not fitting:
        need = min((c.max_chip_bytes for c in candidates), default=float("nan"))
        raise PlanError(f"no layout on {chips} {chip.name} chip(s) fits: smallest shard needs "
                        f"{need / 1e9:.2f} GB, a chip has {chip.memory_bytes / 1e9:.2f} GB")
    best = max(fitting, key=lambda c: (c.fits_fast_memory, c.tokens_per_s, -c.chips))
    return best, candidates


AUTO = "auto"
DEVICE_CHIP = {"cpu": "cpu-core", "cuda": "h100"}
"""The chip preset ``auto_layout`` plans for on each device (an H100 stands for any GPU: the pick
depends on fast memory and link costs far more than on the GPU's generation)."""


def auto_layout(model_path: str | Path, *, chips: int, device: str = "cpu", tp: int | str = AUTO,
                pp: int | str = AUTO, dtype: str | None = None) -> tuple[Layout, str]:
    """The planner's layout for the checkpoint at ``model_path`` on ``chips`` chips of ``device``
    (``tp``/``pp`` = ``"auto"`` is chosen, an int is kept), and the reasoning in one line.

    What ``lanes.fast.tp/pp: auto`` deploys: ``fastmode bench sharding`` measures every layout on
    the machine and reports whether this pick is the fastest one measured."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    chip = load_chip(DEVICE_CHIP[device])
    best, candidates = plan(config, chip, max(1, chips), dtype, tp=None if tp == AUTO else int(tp),
                            pp=None if pp == AUTO else int(pp))
    return best, reasoning(best, candidates, chip)


def reasoning(best: Layout, candidates: list[Layout], chip: ChipSpec) -> str:
    fast = [c for c in candidates if c.fits_fast_memory]
    if best.fits_fast_memory:
        why = (f"{len(fast)} of {len(candidates)} layouts keep every shard resident in fast memory "
               f"({chip.fast_memory_bytes / 2**20:.0f} MiB per chip); of those, {best.tp}x{best.pp} "
               f"predicts the most tokens/s")
    else:
        why = (f"no layout fits fast memory ({chip.fast_memory_bytes / 2**20:.0f} MiB per chip), so weights "
               f"stream from main memory; {best.tp}x{best.pp} predicts the most tokens/s among those that fit")
    parts = (f"weights {best.compute_s * 1e6:.0f} us + collectives {best.collective_s * 1e6:.0f} us + "
             f"hops {best.hop_s * 1e6:.0f} us per token")
    return f"{why}: {parts}."


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fastmode plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="checkpoint directory (its config.json)")
    p.add_argument("--chip", required=True, help=f"preset ({', '.join(preset_names())}) or spec file")
    p.add_argument("--chips", type=int, default=8, help="chips available (default 8)")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="weight dtype (default: the config's)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    cfg_path = args.model / "config.json"
    if not cfg_path.is_file():
        p.error(f"{args.model} has no config.json")
    from .errors import ShardingError
    from .weights import check_checkpoint

    try:
        check_checkpoint(args.model)  # the checks fastmode up makes: a model the executor runs, its tensors
        chip = load_chip(args.chip)
        best, candidates = plan(json.loads(cfg_path.read_text()), chip, args.chips, args.dtype)
    except (ChipSpecError, PlanError, ShardingError) as e:
        print(f"fastmode plan: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"chip": chip.to_dict(), "chosen": asdict(best),
                          "candidates": [asdict(c) for c in candidates]}, indent=2))
        return 0
    print(f"model {args.model} on up to {args.chips} x {chip.name}")
    print(f"{'tp x pp':>8} {'chips':>5} {'MB/chip':>9} {'fits fast':>9} {'tokens/s':>10}")
    for c in sorted(candidates, key=lambda c: (c.chips, c.tp)):
        mark = "  <- plan" if c is best else ("  (does not fit)" if not c.fits_memory else "")
        print(f"{c.tp:>4} x {c.pp:<2} {c.chips:>5} {c.max_chip_bytes / 1e6:>9.2f} "
              f"{'yes' if c.fits_fast_memory else 'no':>9} {c.tokens_per_s:>10.0f}{mark}")
    print(f"\nplan: tp={best.tp} pp={best.pp}. {reasoning(best, candidates, chip)}")
    return 0
