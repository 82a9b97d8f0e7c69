"""Chip specs for the planner: what one chip holds and how fast it moves bytes.

Presets are public spec-sheet figures (rounded; see each ``source``), except ``cpu-core``, which
describes one core of the machine the planner runs on (cache sizes read from sysfs, bandwidths
typical of a server core). A custom chip comes from a JSON or YAML file with the same fields.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

GiB = 2**30
MiB = 2**20


class ChipSpecError(ValueError):
    """A chip spec file or preset name that cannot be used."""

    code = "invalid_chip_spec"


@dataclass(frozen=True, kw_only=True)
class ChipSpec:
    """One chip, as the planner sees it."""

    name: str
    memory_bytes: float
    """Capacity of the chip's main memory (HBM, or host DRAM for a CPU core)."""
    fast_memory_bytes: float
    """Capacity of on-chip fast memory (SRAM / cache) that can keep weights resident."""
    memory_bandwidth: float
    """Bytes/s streamed from main memory."""
    fast_memory_bandwidth: float
    """Bytes/s read from fast memory when the shard is resident there."""
    link_bandwidth: float
    """Bytes/s of one chip-to-chip link (one direction)."""
    link_latency: float
    """Seconds per pipeline hop between chips, transport included (a Ray actor hop on CPU)."""
    link_latency_collective: float
    """Seconds per tensor-parallel collective among the chips of a stage (gloo on CPU, NCCL on GPU)."""
    layer_overhead: float
    """Seconds of fixed cost per decoder layer per step (kernel launches, dispatch), whatever its size."""
    source: str = ""
    """Where the figures come from."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name not in ("name", "source") and (not isinstance(v, (int, float)) or v < 0):
                raise ChipSpecError(f"chip {self.name!r}: {f.name} must be a non-negative number, got {v!r}")
        if self.memory_bandwidth <= 0 or self.link_bandwidth <= 0:
            raise ChipSpecError(f"chip {self.name!r}: bandwidths must be positive")

    def to_dict(self) -> dict:
        return asdict(self)


def _cpu_core() -> ChipSpec:
    """One core of this host: its L2 plus its share of L3 is the fast memory."""
    cores = os.cpu_count() or 1

    def cache(index: int, default: float) -> float:
        p = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        try:
            text = p.read_text().strip()
            return float(text[:-1]) * {"K": 2**10, "M": MiB, "G": GiB}[text[-1]]
        except (OSError, ValueError, KeyError, IndexError):
            return default

    l2, l3 = cache(2, 1 * MiB), cache(3, 16 * MiB)
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 16 * GiB
    return ChipSpec(
        name="cpu-core",
        memory_bytes=mem / cores,
        fast_memory_bytes=l2 + l3 / cores,
        memory_bandwidth=10e9,
        fast_memory_bandwidth=50e9,
        link_bandwidth=2e9,
        link_latency=60e-6,
        link_latency_collective=1.5e-3,
        layer_overhead=0.15e-3,
        source=("this host's caches (sysfs) and memory / cores; bandwidths typical of one server core. "
                "Latencies measured by fastmode bench sharding on a small CPU host (docs/decisions/): link = "
                "one hop of the ring's TCP links between chip actors (small messages, with the spin window); "
                "layer overhead = a compiled single-stream decode step of models/fast on the ring's stages, "
                "per layer (embedding, head, sampling and scheduling included); collective = one gloo "
                "all-reduce between two chip actors (gloo waits in the kernel, so each collective pays the "
                "cores' wake-ups)"),
    )


PRESETS = {
    "h100": ChipSpec(
        name="h100", memory_bytes=80e9, fast_memory_bytes=50 * MiB, memory_bandwidth=3.35e12,
        fast_memory_bandwidth=10e12, link_bandwidth=450e9, link_latency=10e-6,
        link_latency_collective=8e-6,
        layer_overhead=10e-6,
        source="NVIDIA H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s, 50 MB L2, NVLink 900 GB/s (both directions)",
    ),
    "h200": ChipSpec(
        name="h200", memory_bytes=141e9, fast_memory_bytes=50 * MiB, memory_bandwidth=4.8e12,
        fast_memory_bandwidth=10e12, link_bandwidth=450e9, link_latency=10e-6,
        link_latency_collective=8e-6,
        layer_overhead=10e-6,
        source="NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, 50 MB L2, NVLink 900 GB/s (both directions)",
    ),
    "wse-3": ChipSpec(
        name="wse-3", memory_bytes=44e9, fast_memory_bytes=44e9, memory_bandwidth=21e15,
        fast_memory_bandwidth=21e15, link_bandwidth=150e9, link_latency=5e-6,
        link_latency_collective=2e-6,
        layer_overhead=1e-6,
        source="Cerebras WSE-3: 44 GB on-chip SRAM at 21 PB/s; CS-3 system I/O about 1.2 Tb/s",
    ),
}


def preset_names() -> list[str]:
    return ["cpu-core", *PRESETS]


def load_chip(name_or_path: str) -> ChipSpec:
    """A preset by name, or a spec file (JSON or YAML) with ``ChipSpec``'s fields."""
    if name_or_path == "cpu-core":
        return _cpu_core()
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ChipSpecError(f"unknown chip {name_or_path!r}: use one of {preset_names()} or a spec file")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error is the user's file
        raise ChipSpecError(f"{path}: cannot parse chip spec: {e}") from e
    if not isinstance(data, dict):
        raise ChipSpecError(f"{path}: a chip spec is a mapping of fields")
    known = {f.name for f in fields(ChipSpec)}
    unknown = set(data) - known
    if unknown:
        raise ChipSpecError(f"{path}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    data.setdefault("name", path.stem)
    for key, value in data.items():
        # YAML 1.1 reads "1e-05" (no dot) as a string: accept numbers written that way.
        if key not in ("name", "source") and isinstance(value, str):
            try:
                data[key] = float(value)
            except ValueError:
                raise ChipSpecError(f"{path}: {key} must be a number, got {value!r}") from None
    try:
        return ChipSpec(**data)
    except TypeError as e:
        raise ChipSpecError(f"{path}: {e}") from e
