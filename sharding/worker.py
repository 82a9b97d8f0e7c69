"""``ChipWorker``: the Ray actor that is one chip, holding one shard (a TP rank of a pipeline stage).

A worker loads only its shard (``load_model`` with its layer range and TP rank), keeps the KV
cache of those layers and kv heads, and joins its stage's tensor-parallel process group (gloo on
CPU, NCCL on GPU; one group per stage, so it is the process's default group). ``run`` is its one
step method, wired into a Ray compiled graph by ``sharding.pipeline``:

- first stage: input is the driver's ``StepBatch``; later stages: the previous stage's
  ``Activations``, read straight from that stage's rank 0 (never through the driver);
- every rank computes (the collectives need them all); rank 0 of a stage sends ``Activations``
  on, rank 0 of the last stage samples and answers the ``StepResult``, other ranks answer a
  ``RankDone`` holding the hop they saw.

Each received payload becomes a ``Hop`` record (a few ints) carried along to the driver.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field, replace

import ray
import torch
import torch.distributed as dist

from .batch import DRIVER, DRIVER_STAGE, Hop, StepBatch, StepResult, payload_bytes
from .stage import StageRunner
from .weights import load_model


@dataclass
class Activations:
    """What a stage's rank 0 sends to every rank of the next stage."""

    batch: StepBatch
    """The step, without token ids (only the first stage embeds them)."""
    hidden: list[torch.Tensor]
    """``[B, S, D]`` per part of the batch."""
    sent_at: int
    """``time.time_ns()`` when it was sent."""
    src_chip: str
    src_stage: int
    hops: list[Hop] = field(default_factory=list)
    """Hops seen so far along the chain of rank 0s."""
    stage_seconds: list[float] = field(default_factory=list)
    """Compute seconds of each stage so far."""


@dataclass
class RankDone:
    """A non-zero TP rank's answer: its output is its rank 0's, so only its hop travels."""

    hops: list[Hop]


class ChipWorker:
    """One chip: a shard of the model and its cache (create with ``ray.remote`` options, see
    ``sharding.pipeline``).

    Args:
        index: the chip's position in the layout (``stage * tp + tp_rank``).
        stage, num_stages: its pipeline stage, and how many there are.
        tp_rank, tp_size: its rank in the stage's tensor-parallel group.
        transport: the label its ``Hop`` records carry.
        device: ``"cpu"`` (one intra-op thread: a chip is a core) or ``"cuda"``.
    """

    def __init__(self, *, index: int, stage: int, num_stages: int, tp_rank: int, tp_size: int,
                 transport: str, device: str = "cpu") -> None:
        self.node_ip = ray.util.get_node_ip_address()
        self.chip = f"{self.node_ip}/chip{index}"
        self.stage, self.is_last = stage, stage == num_stages - 1
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.transport, self.device = transport, torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(1)
        self.runner: StageRunner | None = None

    def chip_id(self) -> tuple[str, str]:
        """``(chip id, node ip)``."""
        return self.chip, self.node_ip

    def rendezvous(self) -> str:
        """(TP rank 0) the ``tcp://`` address its stage's process group meets at."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{self.node_ip}:{port}"

    def setup(self, path: str, *, layer_range: tuple[int, int], init_method: str | None,
              num_slots: int, max_len: int | None, dtype: torch.dtype) -> None:
        """Join the stage's TP group (if ``tp_size > 1``), then load the shard and build its cache.

        All ranks of a stage must call this concurrently (joining the group blocks until all do).
        """
        group = None
        if self.tp_size > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=init_method, rank=self.tp_rank,
                                    world_size=self.tp_size)
            group = dist.group.WORLD
        model = load_model(path, layer_range=layer_range, tp_rank=self.tp_rank, tp_size=self.tp_size,
                           tp_group=group, dtype=dtype, device=self.device)
        self.runner = StageRunner(model, num_slots=num_slots, max_len=max_len)

    @torch.inference_mode()
    def run(self, inp: StepBatch | Activations) -> Activations | StepResult | RankDone:
        """Run this chip's share of one step (see the module docstring)."""
        arrived = time.time_ns()
        if isinstance(inp, StepBatch):
            batch, x, hops, stage_seconds = inp, None, [], []
            sent = Hop(DRIVER, self.chip, DRIVER_STAGE, self.stage,
                       payload_bytes([t for r in inp.parts() for t in (r.tokens, r.positions, r.slots, r.last)]),
                       (arrived - inp.sent_at) / 1e9, self.transport, arrived)
        else:
            batch, x, hops, stage_seconds = inp.batch, inp.hidden, inp.hops, inp.stage_seconds
            sent = Hop(inp.src_chip, self.chip, inp.src_stage, self.stage, payload_bytes(inp.hidden),
                       (arrived - inp.sent_at) / 1e9, self.transport, arrived)
        start = time.perf_counter()
        parts = batch.parts()
        hidden = self.runner.forward(parts, x)
        if not self.is_last:
            if self.tp_rank:
                return RankDone([sent])
            onward = replace(batch, prefill=batch.prefill and batch.prefill.without_tokens(),
                             decode=batch.decode and batch.decode.without_tokens())
            # Hidden states leave the device here only if the graph's channels are host memory.
            return Activations(onward, [h.cpu() for h in hidden], time.time_ns(), self.chip, self.stage,
                               hops + [sent], stage_seconds + [time.perf_counter() - start])
        logits, full = self.runner.logits(parts, hidden, batch.return_logits)  # all ranks: all-gather
        if self.tp_rank:
            return RankDone([sent])
        self.runner.update_generators(batch)
        tokens = self.runner.sample(parts, logits)
        full = [f.cpu() for f in full] if full is not None else None
        return StepResult.of_parts(batch, tokens, hops=hops + [sent],
                                   stage_seconds=stage_seconds + [time.perf_counter() - start],
                                   logits=full, sent_at=time.time_ns())
