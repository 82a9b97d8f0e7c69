"""``ShardedModel``: an ``Engine`` whose model is split ``tp x pp`` over chips, each a Ray actor.

The ``PipelineExecutor`` reserves one placement group per stage, starts one ``ChipWorker`` per
chip, and wires them into a Ray compiled graph:

    driver -> stage 0 (all TP ranks read the batch) -> stage 1 (all ranks read stage 0's rank 0)
           -> ... -> last stage's rank 0 (samples) -> driver (token ids only)

Activations go from actor to actor through the graph's channels, never back through the driver,
and every transfer is reported as a ``Hop`` in ``StepResult.hops`` (``engine.last_hops``). Why a
compiled graph: see ``docs/sharding.md`` (about 1.5 ms per driver -> a -> b -> driver round trip
here, against tens of ms for chained actor calls, which remain available as
``transport="actor_calls"``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Self

import ray
import torch
from ray.dag import InputNode, MultiOutputNode
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .batch import DRIVER, DRIVER_STAGE, Hop, StepBatch, StepResult
from .config import ModelConfig
from .engine import Engine
from .errors import InvalidLayout
from .placement import CHIP, ChipPlacement, release, require_chips, reserve_stages, stage_layers
from .worker import ChipWorker

TRANSPORTS = ("compiled_graph", "actor_calls")


class PipelineExecutor:
    """Runs steps on a ``tp x pp`` layout of ``ChipWorker`` actors (see the module docstring).

    Args:
        path: checkpoint dir, readable at the same path on every node.
        tp, pp: tensor-parallel ranks per stage, pipeline stages.
        num_slots, max_len, dtype: of every shard's KV cache and weights.
        transport: ``"compiled_graph"`` (default) or ``"actor_calls"``.
        device: ``"cpu"``, or ``"cuda"`` (one GPU per chip; untested here).
        placement_timeout_s: how long to wait for free chips before ``NotEnoughChips``.
        step_timeout_s: how long one step may take before Ray raises a timeout.

    Raises ``InvalidLayout`` (tp/pp not dividing the model, bad transport) and ``NotEnoughChips``
    before starting anything; on any failure while starting, everything started is torn down.
    """

    def __init__(self, path: str | Path, *, tp: int = 1, pp: int = 1, num_slots: int = 8,
                 max_len: int | None = None, dtype: torch.dtype = torch.float32,
                 transport: str = "compiled_graph", device: str = "cpu",
                 placement_timeout_s: float = 60.0, step_timeout_s: float = 120.0) -> None:
        if transport not in TRANSPORTS:
            raise InvalidLayout(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.config = config = ModelConfig.from_pretrained(path)
        ranges = stage_layers(config, tp, pp)
        self.max_len = config.max_position_embeddings if max_len is None else max_len
        if not 1 <= self.max_len <= config.max_position_embeddings:
            raise InvalidLayout(f"max_len {self.max_len} is not within the model's context "
                                f"[1, {config.max_position_embeddings}]")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise InvalidLayout(f"num_slots must be a positive int, got {num_slots!r}")
        self.num_slots, self.tp, self.pp, self.transport = num_slots, tp, pp, transport
        self.step_timeout_s = step_timeout_s
        require_chips(tp * pp)
        self._groups, self._stages, self._compiled = [], [], None
        self.layout: list[ChipPlacement] = []
        try:
            self._groups = reserve_stages(tp, pp, timeout_s=placement_timeout_s,
                                          gpus_per_chip=1 if device == "cuda" else 0)
            self._stages = [self._start_stage(s, pg, device) for s, pg in enumerate(self._groups)]
            ids = ray.get([w.chip_id.remote() for ws in self._stages for w in ws], timeout=placement_timeout_s)
            self.layout = [ChipPlacement(chip, i, i // tp, i % tp, ranges[i // tp], i < tp, i >= (pp - 1) * tp, ip)
                           for i, (chip, ip) in enumerate(ids)]
            self._setup(str(path), ranges, dtype, placement_timeout_s)
            if transport == "compiled_graph":
                self._compiled = self._compile()
        except BaseException:
            self.shutdown()
            raise

    def _start_stage(self, stage: int, pg, device: str) -> list:
        actor = ray.remote(ChipWorker)
        return [actor.options(
            num_cpus=0, num_gpus=1 if device == "cuda" else 0, resources={CHIP: 1},
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                 placement_group_bundle_index=r),
        ).remote(index=stage * self.tp + r, stage=stage, num_stages=self.pp, tp_rank=r, tp_size=self.tp,
                 transport=self.transport, device=device) for r in range(self.tp)]

    def _setup(self, path: str, ranges: list[tuple[int, int]], dtype: torch.dtype, timeout_s: float) -> None:
        inits = [None] * self.pp
        if self.tp > 1:
            inits = ray.get([ws[0].rendezvous.remote() for ws in self._stages], timeout=timeout_s)
        # Every rank of every stage at once: joining a process group blocks until the stage is whole.
        ray.get([w.setup.remote(path, layer_range=ranges[s], init_method=inits[s], num_slots=self.num_slots,
                                max_len=self.max_len, dtype=dtype)
                 for s, ws in enumerate(self._stages) for w in ws], timeout=timeout_s + 120)

    def _compile(self):
        with InputNode() as batch:
            prev, others = batch, []
            for workers in self._stages:
                nodes = [w.run.bind(prev) for w in workers]
                prev, others = nodes[0], others + nodes[1:]  # every output must be read by someone
            dag = MultiOutputNode([prev] + others)
        # Room for a prefill of every slot at full length (fp32), capped: a larger payload grows
        # its channel on demand, once (a few hundred ms).
        widest = self.num_slots * self.max_len * self.config.hidden_size * 4 + 2**16
        return dag.experimental_compile(_buffer_size_bytes=min(max(10**6, widest), 2**26))

    def _submit(self, batch: StepBatch) -> list:
        if self._compiled is not None:
            return ray.get(self._compiled.execute(batch), timeout=self.step_timeout_s)
        prev, others = batch, []
        for workers in self._stages:
            refs = [w.run.remote(prev) for w in workers]  # ObjectRef args: resolved actor to actor
            prev, others = refs[0], others + refs[1:]
        return ray.get([prev] + others, timeout=self.step_timeout_s)

    def execute(self, batch: StepBatch) -> StepResult:
        """Send ``batch`` through the stages; collect the tokens and every hop of the step."""
        if not self._stages:
            raise RuntimeError("the pipeline has been shut down")
        batch.sent_at = time.time_ns()
        result, *done = self._submit(batch)
        back = time.time_ns()
        last = self.layout[-self.tp].chip  # rank 0 of the last stage
        n_tokens = len(result.prefill) + len(result.decode)
        result.hops += [h for d in done for h in d.hops]
        result.hops.append(Hop(last, DRIVER, self.pp - 1, DRIVER_STAGE, 8 * n_tokens,
                               (back - result.sent_at) / 1e9, self.transport, back))
        return result

    def shutdown(self) -> None:
        """Tear down the graph, kill the actors, remove the placement groups; idempotent."""
        if self._compiled is not None:
            # Raises if an actor is already dead; killing them below is what matters.
            with contextlib.suppress(Exception):
                self._compiled.teardown()
            self._compiled = None
        for w in [w for ws in self._stages for w in ws]:
            ray.kill(w, no_restart=True)
        self._stages = []
        release(self._groups)
        self._groups = []


class ShardedModel(Engine):
    """An ``Engine`` (``add``/``abort``/``step``/``generate``/``prompt_logits``) over a
    ``PipelineExecutor``; each ``step()``'s hops are in ``last_hops`` afterwards.

    Build with ``from_pretrained``; release with ``shutdown()`` or a ``with`` block.
    """

    executor: PipelineExecutor
    _started_ray = False

    @classmethod
    def from_pretrained(cls, path: str | Path, *, tp: int = 1, pp: int = 1, num_slots: int = 8,
                        max_len: int | None = None, dtype: torch.dtype = torch.float32,
                        ray_address: str | None = None, **executor_options) -> ShardedModel:
        """Shard the checkpoint at ``path`` over ``tp * pp`` chips of a Ray cluster.

        Uses the Ray session already initialised in this process, else connects to
        ``ray_address`` (or ``RAY_ADDRESS``), else starts a local Ray whose chips are this
        machine's cores (``shutdown`` stops it again). ``executor_options`` go to
        ``PipelineExecutor`` (``transport``, ``device``, timeouts).
        """
        started_ray = False
        if not ray.is_initialized():
            if ray_address is None and "RAY_ADDRESS" not in os.environ:
                ray.init(resources={CHIP: os.cpu_count() or 1}, include_dashboard=False)
            else:
                ray.init(address=ray_address, include_dashboard=False)
            started_ray = True
        try:
            executor = PipelineExecutor(path, tp=tp, pp=pp, num_slots=num_slots, max_len=max_len,
                                        dtype=dtype, **executor_options)
        except BaseException:
            if started_ray:
                ray.shutdown()
            raise
        engine = cls(executor=executor)
        engine._started_ray = started_ray
        return engine

    @property
    def layout(self) -> list[ChipPlacement]:
        """Every chip, in ``index`` order: its id, stage, TP rank, layers and node."""
        return self.executor.layout

    def shutdown(self) -> None:
        """Release the chips (graph, actors, placement groups), and Ray if this model started it."""
        self.executor.shutdown()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
