"""Where a ``tp x pp`` layout goes: stage layer ranges, and one Ray placement group per stage.

Chips are the custom Ray resource ``chip`` (a node started with ``ray start --resources
'{"chip": 4}'`` offers four). A stage's ``tp`` ranks all-reduce twice per layer, so they are
packed onto one node (``STRICT_PACK``); consecutive stages exchange one activation per step and
may land on different nodes.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from .config import ModelConfig
from .errors import InvalidLayout, NotEnoughChips
from .tp import check_tp

CHIP = "chip"
"""The Ray custom resource that counts chips."""


@dataclass(frozen=True)
class ChipPlacement:
    """One chip of a layout: which shard it holds and where it runs."""

    chip: str
    """``"<node_ip>/chip<index>"``, the id used in ``Hop`` records."""
    index: int
    """``stage * tp + tp_rank``: the chip's position in the layout."""
    stage: int
    tp_rank: int
    layers: tuple[int, int]
    """``(start, stop)`` global indices of the decoder layers it holds a shard of."""
    has_embedding: bool
    has_head: bool
    node_ip: str


def stage_layers(config: ModelConfig, tp: int, pp: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` layer range of each of ``pp`` stages: equal where ``pp`` divides the layers,
    else the first ``num_layers % pp`` stages take one layer more (the last stage also runs the head).

    Raises ``InvalidLayout`` unless ``tp`` can split the model (``sharding.tp.check_tp``) and every
    stage gets at least one layer.
    """
    check_tp(config, tp)
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise InvalidLayout(f"pipeline parallel size must be a positive int, got {pp!r}")
    if pp > config.num_layers:
        raise InvalidLayout(f"pipeline parallel size {pp} exceeds num_hidden_layers={config.num_layers}: "
                            "every stage needs a layer")
    per, extra = divmod(config.num_layers, pp)
    bounds = [0]
    for s in range(pp):
        bounds.append(bounds[-1] + per + (s < extra))
    return list(zip(bounds[:-1], bounds[1:]))


def require_chips(needed: int) -> None:
    """Raise ``NotEnoughChips`` unless the cluster has at least ``needed`` chips in total."""
    present = ray.cluster_resources().get(CHIP, 0)
    if present < needed:
        raise NotEnoughChips(f"layout needs {needed} chips (Ray resource {CHIP!r}) but the cluster has "
                             f"{present:g}; start nodes with --resources '{{\"{CHIP}\": N}}'")


def reserve_stages(tp: int, pp: int, *, timeout_s: float, gpus_per_chip: float = 0) -> list[PlacementGroup]:
    """One ``STRICT_PACK`` placement group of ``tp`` chip bundles per stage, all ready.

    Waits up to ``timeout_s`` in all; on timeout (chips held by others, or no node with ``tp``
    free chips) removes every group it made and raises ``NotEnoughChips``.
    """
    bundle = {CHIP: 1} | ({"GPU": gpus_per_chip} if gpus_per_chip else {})
    tag = uuid.uuid4().hex[:8]  # names are cluster-wide: several models may be placed at once
    groups: list[PlacementGroup] = []
    deadline = time.monotonic() + timeout_s
    try:
        for s in range(pp):
            groups.append(placement_group([dict(bundle) for _ in range(tp)], strategy="STRICT_PACK",
                                          name=f"fastmode-{tag}-stage{s}"))
        for s, pg in enumerate(groups):
            left = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait([pg.ready()], timeout=left)
            if not ready:
                raise NotEnoughChips(f"stage {s} could not get {tp} chips on one node within {timeout_s:g} s "
                                     f"(in use by others, or spread over nodes)")
    except BaseException:
        release(groups)
        raise
    return groups


def release(groups: list[PlacementGroup]) -> None:
    """Remove placement groups, ignoring ones already gone."""
    for pg in groups:
        with contextlib.suppress(Exception):  # already removed, or the cluster is shutting down
            remove_placement_group(pg)


def ensure_ray(address: str | None = None) -> bool:
    """Use this process's Ray session, else join ``address`` (or ``RAY_ADDRESS``), else start a local
    Ray whose chips are this machine's cores. Answers whether it started (or joined) one, i.e.
    whether the caller should ``ray.shutdown()`` when done."""
    if ray.is_initialized():
        return False
    if address is None and "RAY_ADDRESS" not in os.environ:
        ray.init(resources={CHIP: os.cpu_count() or 1}, include_dashboard=False)
    else:
        ray.init(address=address, include_dashboard=False)
    return True
