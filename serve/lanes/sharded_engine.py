"""``ShardedLaneEngine``: fastmode's own executor (``sharding``) behind the ``LaneEngine`` interface.

The fast model runs on a ring of chips (``sharding.pipeline.ShardedModel``) that decodes by
itself. This engine builds and owns the ring, and streams from its head chip as one of its
clients (``HeadClient``): the fast lane's replica holds it. Front doors may stream from the same
head themselves (``serve.lanes.head_links``), with the address and secret ``head_address`` hands out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from sharding.config import ModelConfig
from sharding.draft_vocab import vocab_ids
from sharding.pipeline import ChipUnresponsive, RingFailed, ShardedModel
from sharding.placement import CHIP
from sharding.planner import AUTO, auto_layout
from sharding.transport import frame

from ..config import FastLaneConfig, TelemetryConfig
from ..errors import LaneUnavailable
from .head_client import HeadClient

log = logging.getLogger(__name__)


UNANSWERED_CHECKS = 3
"""Health checks in a row a chip may leave unanswered (``ChipUnresponsive``: 10 s each, Serve's
period apart) before the ring counts as failed and is rebuilt. A chip starved of CPU for a few
seconds by another process on its cores (as on a small host where another server runs beside the
app) is alive: rebuilding it would fail its streams and leave the lane
unavailable for a minute. A dead chip's actor is reported at once (``RingFailed``)."""


def cluster_chips() -> int:
    """Chips the Ray cluster offers (its ``chip`` resource, every node together); without Ray yet,
    the local one ``ShardedModel`` would start: this machine's cores."""
    import ray

    if not ray.is_initialized():
        return os.cpu_count() or 1
    return int(ray.cluster_resources().get(CHIP, 0))


def resolve_layout(path: str | Path, config: FastLaneConfig, chips: int) -> tuple[int, int, str]:
    """``(tp, pp, why)`` the lane deploys: the config's, or where it says ``auto`` the planner's pick
    on ``chips / replicas`` chips (``sharding.planner.auto_layout``)."""
    if AUTO not in (config.tp, config.pp):
        return config.tp, config.pp, "set in the config"
    n = chips // config.replicas
    best, _ = auto_layout(path, chips=n, device=config.device, tp=config.tp, pp=config.pp, dtype=config.dtype)
    return best.tp, best.pp, f"auto: the planner's pick on {n} chip(s), see fastmode plan"


def ring_options(config: FastLaneConfig, path: str | Path, tp: int) -> dict[str, Any]:
    """``ShardedModel``'s options (all but ``tp``/``pp``) for the ring the fast lane runs with ``config``
    on the model at ``path`` with ``tp`` chips a stage (also what ``fastmode bench gateway`` builds in
    process as the engine's own reference). ``vocab``: the ids ``config.vocab`` keeps
    (``sharding.draft_vocab.vocab_ids``; ``"auto"`` keeps them all at ``tp > 1``)."""
    vocab = None
    if config.vocab is not None and not (config.vocab == "auto" and tp > 1):
        model = ModelConfig.from_pretrained(path)
        vocab = vocab_ids(config.vocab, path, model.vocab_size, model.eos_token_ids)
    return {"num_slots": config.num_slots, "max_len": config.max_len, "dtype": getattr(torch, config.dtype),
            "device": config.device, "compile": config.compile, "threads_per_chip": config.threads_per_chip,
            "spin_s": config.spin_us / 1e6, "prefix_cache": config.prefix_cache,
            "packed_weights": config.packed_weights, "kv_cache_bytes": config.kv_cache_bytes, "vocab": vocab,
            "keep_prompt": config.vocab_keeps_prompt and vocab is not None}


class ShardedLaneEngine(HeadClient):
    """The fast model, ``tp x pp`` over chips that decode in a ring.

    Args:
        path: the checkpoint directory.
        config: the fast lane's section of the deployment config.
        tokenizer: the checkpoint's tokenizer (for detokenization and stop strings).
        telemetry: step-span sampling (``TelemetryConfig``).
        door: what opens the lane's own WebSocket in the head's loop (``serve.lanes.door.DoorSpec``), or ``None``.
    """

    def __init__(self, path: str | Path, config: FastLaneConfig, tokenizer: Tokenizer,
                 telemetry: TelemetryConfig | None = None, door=None) -> None:
        self.unanswered_checks = 0
        """Health checks in a row that a chip left unanswered (``UNANSWERED_CHECKS``)."""
        self.tp, self.pp, self.layout_reason = resolve_layout(path, config, cluster_chips())
        self.model = ShardedModel.from_pretrained(path, tp=self.tp, pp=self.pp, **ring_options(config, path, self.tp),
                                                  door=door)
        try:
            self.model.warmup()  # compile now, not on a user's request
            self.model.close_client()  # the warm-up's blocking client; the lane reads asynchronously
        except BaseException:
            self.model.shutdown()
            raise
        super().__init__(self.model.config, self.model.max_len, self.model.client_address, self.model.secret,
                         tokenizer, {"fastmode.tp": self.tp, "fastmode.pp": self.pp,
                                     "fastmode.transport": config.transport}, telemetry)

    def head_address(self) -> dict[str, Any] | None:
        """Where a front door streams from the head itself (``serve.lanes.head_links``): host, port,
        secret, and what its ``HeadClient`` needs (``max_len``, ``layout``); ``None`` once the ring
        has failed."""
        if self._error is not None:
            return None
        host, port = self.model.client_address
        door = self.model.door_address
        return {"host": host, "port": port, "secret": self.model.secret, "max_len": self.max_len,
                "layout": self.layout, "door": None if door is None else {"host": door[0], "port": door[1]}}

    async def prefix_stats(self) -> dict[str, int] | None:
        """The head's prefix cache (``ShardedModel.prefix_stats``), without blocking the loop."""
        if not self.model.prefix_cache:
            return None
        return await self.model.head_worker.prefix_stats.remote()

    async def ring_load(self) -> dict[str, int]:
        """The head's ``running`` requests (from every client: this replica and the front doors
        streaming from the head), its ``clients`` and its ``aborted`` count (``ChipWorker.ring_load``)."""
        return await self.model.head_worker.ring_load.remote()

    async def check_health(self) -> None:
        await super().check_health()
        try:
            await asyncio.to_thread(self.model.check_alive)
        except ChipUnresponsive as e:
            self.unanswered_checks += 1
            if self.unanswered_checks < UNANSWERED_CHECKS:
                log.warning("fast lane: %s (health check %d of %d in a row; the ring is rebuilt after %d)",
                            e, self.unanswered_checks, UNANSWERED_CHECKS, UNANSWERED_CHECKS)
                return
            failed = RingFailed(f"{e}, {self.unanswered_checks} health checks in a row")
        except RingFailed as e:
            failed = e
        else:
            self.unanswered_checks = 0
            return
        self._error = self._error or failed
        raise LaneUnavailable(f"the fast lane's engine has stopped ({failed})") from failed

    def shutdown(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.write(frame(("stop",)))
        self.close()
        self.model.shutdown()
