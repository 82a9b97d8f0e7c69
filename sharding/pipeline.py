"""``ShardedModel``: the fast model split ``tp x pp`` over chips (Ray actors) that decode in a ring.

``from_pretrained`` reserves one placement group per stage, starts one ``ChipWorker`` per chip,
loads every shard, and wires the chips into the ring of ``sharding.ring`` (TCP links, see
``sharding.transport``). From then on the chips run the decode loop themselves; this object is
their client: it sends requests and aborts to the head chip and reads each step's outputs as
they come, over one link. Nothing per token goes through Ray or through this process's Python
beyond reading that link.

A lane holds a ``ShardedModel`` for its lifetime and talks to the head over its own asyncio
connection (``client_address``; ``serve.lanes.sharded_engine``). Tests and benchmarks use the
blocking client here (``add``/``abort``/``step``/``generate``).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import ray
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .batch import Hop
from .config import ModelConfig
from .draft_vocab import checked_ids
from .errors import DuplicateRequest, InvalidLayout, ShardingError
from .kv_cache import fit_max_len
from .placement import CHIP, ChipPlacement, ensure_ray, release, require_chips, reserve_stages, stage_layers
from .ring import SECRET_BYTES, StepInfo, ring_links, step_infos
from .sampling import SamplingParams, params_per_prompt
from .scheduler import StepOutput, validate_request
from .stage import warm_up
from .tp import kv_heads_per_rank
from .transport import SPIN_S, Link
from .worker import ChipWorker

# Once its chips are reserved, how long each start-up step may take beyond the placement timeout: a
# chip's process starts, imports torch and loads its layers, which on a loaded CPU takes minutes.
START_S = 300.0


class RingFailed(ShardingError):
    """The ring stopped: a chip died or raised. The model must be rebuilt."""

    code = "engine_failed"


COMPILE_STEP_S = 1800.0
"""The longest one warm-up step may take: its first run of a shape compiles it."""


class ChipUnresponsive(ShardingError):
    """A chip's actor did not answer within the timeout. It may be alive but starved of CPU (another
    process busy on its cores): unlike ``RingFailed``, not by itself a reason to rebuild the ring."""

    code = "chip_unresponsive"


class ShardedModel:
    """The fast model on a ring of chips; build with ``from_pretrained``, release with ``shutdown()``
    (or a ``with`` block).

    Attributes:
        config, max_len, num_slots, tp, pp: the model and layout.
        layout: every chip (``ChipPlacement``), in index order.
        client_address: ``(host, port)`` of the head chip's client links; a client sends ``secret``
            (32 bytes) first. Several clients may stream at once (``sharding.ring.Head``).
        last_infos: the ``StepInfo`` of every step in the message last read by ``step()``;
            ``last_info`` the latest of them (its ``hops``: ``last_hops``).
        packed_linears: per chip, how many of its linears run from packed bfloat16 weights
            (``packed_weights``, ``sharding.packed``; 0: off on that chip).
        door_address: ``(host, port)`` of the front door the head serves in its loop (option
            ``door``: what opens it there, ``serve.lanes.door.DoorSpec``), or ``None``.
        vocab: the only token ids the model produces (option ``vocab``, ascending: the head chip's
            head keeps their rows alone, ``sharding.stage.StageRunner``; tp 1 only), or ``None``.
        keep_prompt: (option ``keep_prompt``) with ``vocab``, each request may also produce its own
            prompt's tokens (``sharding.draft_vocab.PromptRows``).
    """

    def __init__(self, path: str | Path, *, tp: int = 1, pp: int = 1, num_slots: int = 8,
                 max_len: int | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 compile: bool = False, threads_per_chip: int = 1, spin_s: float = SPIN_S,
                 placement_timeout_s: float = 60.0, prefix_cache: bool = False,
                 packed_weights: bool | str = False, door=None, kv_cache_bytes: int | None = None,
                 vocab: Sequence[int] | None = None, keep_prompt: bool = False) -> None:
        self.config = config = ModelConfig.from_pretrained(path)
        ranges = stage_layers(config, tp, pp)
        self.vocab = None if vocab is None else checked_ids(vocab, config.vocab_size).tolist()
        self.keep_prompt = keep_prompt and self.vocab is not None
        if self.vocab is not None and tp > 1:
            raise InvalidLayout(f"a cut vocabulary (vocab) needs the head on one chip: tp 1, got tp {tp}")
        if not isinstance(num_slots, int) or num_slots < 1:
            raise InvalidLayout(f"num_slots must be a positive int, got {num_slots!r}")
        # One length for every chip, sized for the chip holding the most cache (kv_cache_bytes: per chip).
        self.max_len = fit_max_len(config, num_slots=num_slots, layers=max(b - a for a, b in ranges),
                                   kv_heads=kv_heads_per_rank(config, tp), dtype=dtype, max_len=max_len,
                                   kv_cache_bytes=kv_cache_bytes)
        self.num_slots, self.tp, self.pp, self.compile = num_slots, tp, pp, compile
        self.prefix_cache, self.door = prefix_cache, door
        self.door_address: tuple[str, int] | None = None
        require_chips(tp * pp)
        self._groups, self._workers = [], []
        self.layout: list[ChipPlacement] = []
        self._client: Link | None = None
        self._unfinished: set[str] = set()
        self.last_info: StepInfo | None = None
        self.last_infos: list[StepInfo] = []
        self.packed_linears: list[int] = []
        self._started_ray = False
        self.secret = secrets.token_bytes(SECRET_BYTES)
        try:
            self._groups = reserve_stages(tp, pp, timeout_s=placement_timeout_s,
                                          gpus_per_chip=1 if device == "cuda" else 0)
            actor = ray.remote(ChipWorker)
            self._workers = [actor.options(
                num_cpus=0, num_gpus=1 if device == "cuda" else 0, resources={CHIP: 1},
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self._groups[i // tp],
                                                                     placement_group_bundle_index=i % tp),
            ).remote(index=i, stage=i // tp, num_stages=pp, tp_rank=i % tp, tp_size=tp, device=device,
                     threads=threads_per_chip, spin_s=spin_s) for i in range(tp * pp)]
            start_s = placement_timeout_s + START_S
            ids = ray.get([w.chip_id.remote() for w in self._workers], timeout=start_s)
            self.layout = [ChipPlacement(chip, i, i // tp, i % tp, ranges[i // tp], i < tp, i >= (pp - 1) * tp, ip)
                           for i, (chip, ip) in enumerate(ids)]
            inits = [None] * pp
            if tp > 1:
                inits = ray.get([self._workers[s * tp].rendezvous.remote() for s in range(pp)], timeout=start_s)
            # Every rank of every stage at once: joining a process group blocks until the stage is whole.
            self.packed_linears = ray.get([
                w.setup.remote(str(path), layer_range=ranges[i // tp], init_method=inits[i // tp], num_slots=num_slots,
                               max_len=self.max_len, dtype=dtype, compile=compile, packed_weights=packed_weights,
                               kv_cache_bytes=kv_cache_bytes, vocab=self.vocab, keep_prompt=self.keep_prompt)
                for i, w in enumerate(self._workers)], timeout=start_s)
            self._wire(start_s)
        except BaseException:
            self.shutdown()
            raise

    def _wire(self, timeout_s: float) -> None:
        ends = ray.get([w.listen.remote() for w in self._workers], timeout=timeout_s)
        links = ring_links(self.tp, self.pp)
        ray.get([w.connect.remote([(dst, ends[dst][0], ends[dst][1]) for src, dst in links if src == i])
                 for i, w in enumerate(self._workers)], timeout=timeout_s)
        started = ray.get([w.start.remote({"returns": [s for s, d in links if d == 0]}, self.prefix_cache, self.secret,
                                          self.door)
                           if i == 0 else
                           w.start.remote({"prev": [s for s, d in links if d == i]})
                           for i, w in enumerate(self._workers)], timeout=timeout_s)
        self.client_address = (ends[0][0], ends[0][2])
        self.door_address = started[0]

    @classmethod
    def from_pretrained(cls, path: str | Path, *, ray_address: str | None = None, **options) -> ShardedModel:
        """Shard the checkpoint at ``path`` over ``tp * pp`` chips of a Ray cluster.

        Uses the Ray session already initialised in this process, else connects to
        ``ray_address`` (or ``RAY_ADDRESS``), else starts a local Ray whose chips are this
        machine's cores (``shutdown`` stops it again). ``options``: ``tp``, ``pp``, ``num_slots``,
        ``max_len``, ``dtype``, ``device``, ``compile``, ``threads_per_chip``, ``spin_s``,
        ``placement_timeout_s``, ``prefix_cache`` (the head parks finished sequences' slots for
        prompts that continue them: ``sharding.prefix_cache``), ``packed_weights`` (``True``,
        ``False`` or ``"auto"``, each chip decides: ``sharding.packed.resolve``), ``vocab`` (the
        only token ids it produces; ``sharding.draft_vocab.keep_ids`` picks them), ``keep_prompt``
        (with ``vocab``: each request's prompt tokens too).
        """
        started = ensure_ray(ray_address)
        try:
            model = cls(path, **options)
        except BaseException:
            if started:
                ray.shutdown()
            raise
        model._started_ray = started
        return model

    # -- the blocking client -----------------------------------------------------------------
    @property
    def client(self) -> Link:
        """This process's link to the head (opened on first use)."""
        if self._client is None:
            if not self._workers:
                raise RingFailed("the model has been shut down")
            self._client = Link.connect(*self.client_address)
            self._client.sock.sendall(self.secret)
            self._client.spin_s = 0  # this process waits for the ring; it does not poll
        return self._client

    def close_client(self) -> None:
        """Close this process's blocking client link (the head drops its unfinished requests)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """The typed error ``add`` would raise for this request, before anything is sent."""
        validate_request(self.config, self.max_len, request_id, prompt, params)

    @property
    def has_work(self) -> bool:
        """Whether any request added here has not finished."""
        return bool(self._unfinished)

    @property
    def num_unfinished(self) -> int:
        return len(self._unfinished)

    def add(self, request_id: str, prompt_ids: list[int], params: SamplingParams | None = None) -> None:
        """Send a request to the ring; it joins the batch at the head's next step.

        Raises ``EmptyPrompt``, ``TokenOutOfRange``, ``PromptTooLong`` or ``DuplicateRequest`` at once.
        """
        params = params or SamplingParams(temperature=0)
        prompt = [int(t) for t in prompt_ids]
        self.validate(request_id, prompt, params)
        if request_id in self._unfinished:
            raise DuplicateRequest(f"request {request_id!r} is already in the engine")
        self.client.send(("add", request_id, prompt, params))
        self._unfinished.add(request_id)

    def abort(self, request_id: str) -> bool:
        """Drop a request (it leaves the batch at the next step); ``False`` if it is unknown."""
        if request_id not in self._unfinished:
            return False
        self._unfinished.discard(request_id)
        self.client.send(("abort", request_id))
        return True

    step_timeout_s: float = 120.0
    """How long ``step`` waits for the ring's next message before ``RingFailed`` (``warmup`` allows
    ``COMPILE_STEP_S``: a step of a new shape compiles first)."""

    def step(self, timeout_s: float | None = None) -> list[StepOutput]:
        """The outputs of the ring's next message: the steps since its last one, in order
        (``[]`` at once if nothing added here is running); ``last_infos`` holds those steps.
        ``timeout_s``: default ``step_timeout_s``.

        Outputs of aborted requests still in flight are dropped. ``RingFailed`` if the ring died.
        """
        timeout_s = self.step_timeout_s if timeout_s is None else timeout_s
        while self._unfinished:
            self.client.sock.settimeout(timeout_s)
            try:
                msg, _ = self.client.recv()
            except (TimeoutError, OSError) as e:
                raise RingFailed(f"no step from the ring within {timeout_s} s ({e})") from e
            finally:
                with contextlib.suppress(OSError):
                    self.client.sock.settimeout(None)
            if msg[0] == "fatal":
                raise RingFailed(f"the ring stopped: {msg[1]}\n{msg[2]}")
            if msg[0] == "error":
                self._unfinished.discard(msg[1])
                raise msg[2]
            self.last_infos = step_infos(msg[2])
            self.last_info = self.last_infos[-1]
            outs = []
            for rid, token, finished, reason, cached, logprobs in msg[1]:
                if rid in self._unfinished:
                    outs.append(StepOutput(rid, [token], finished, reason, cached,
                                           None if logprobs is None else [logprobs]))
                    if finished:
                        self._unfinished.discard(rid)
            return outs
        return []

    @property
    def last_hops(self) -> list[Hop]:
        """Every hop of the latest step read by ``step()``."""
        return self.last_info.hops if self.last_info is not None else []

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[int]]:
        """Generate for every prompt (continuously batched in the ring); the new tokens of each."""
        if self.has_work:
            raise RuntimeError("generate() needs an idle model; drive add()/step() instead")
        params_list = params_per_prompt(prompts, params)
        ids = [f"generate-{id(self)}-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        out: dict[str, list[int]] = {rid: [] for rid in ids}
        try:
            for rid, prompt, p in zip(ids, prompts, params_list, strict=True):
                self.add(rid, prompt, p)
            while self.has_work:
                for o in self.step():
                    out[o.request_id] += o.token_ids
        except BaseException:
            for rid in ids:
                with contextlib.suppress(Exception):
                    self.abort(rid)
            raise
        return [out[rid] for rid in ids]

    def warmup(self) -> None:
        """Run the shapes a served lane meets so that compiling happens now, not on a user's
        request (``sharding.stage.warm_up``); then each chip goes to its node's compute CPUs where
        placement is on (``ChipWorker.place``): until then a chip loads and compiles on every CPU.
        A step may take up to ``COMPILE_STEP_S`` here (a cold compile of a real model's step on a
        small, busy CPU takes minutes)."""
        before, self.step_timeout_s = self.step_timeout_s, max(self.step_timeout_s, COMPILE_STEP_S)
        try:
            warm_up(self)
        finally:
            self.step_timeout_s = before
        ray.get([w.place.remote() for w in self._workers])

    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Debug: the logits ``[S, V]`` of every prompt position, from the last stage, on an idle
        ring (through actor calls, outside the ring; slot 0 is reused: nothing is running)."""
        if self.has_work:
            raise RuntimeError("prompt_logits() needs an idle model")
        prompt = [int(t) for t in prompt_ids]
        self.validate("prompt_logits", prompt, SamplingParams(temperature=0, max_tokens=1))
        if self.prefix_cache:  # slot 0 is about to be overwritten: nothing parked may point into it
            ray.get(self._workers[0].clear_prefix.remote())
        x = None
        for s in range(self.pp):
            refs = [w.prompt_logits.remote(prompt, 0, x) for w in self._workers[s * self.tp:(s + 1) * self.tp]]
            x = refs[0]
            ray.get(refs[1:])  # the other ranks took part in the collectives
        return ray.get(x)

    def prefix_stats(self) -> dict[str, int] | None:
        """The head's prefix cache: ``parked`` slots, ``hits`` and ``reused_tokens`` since start
        (``None`` when ``prefix_cache`` is off)."""
        return ray.get(self.head_worker.prefix_stats.remote(), timeout=10)

    @property
    def head_worker(self):
        """The head chip's actor (``ChipWorker``)."""
        return self._workers[0]

    def check_alive(self, timeout_s: float = 10.0) -> None:
        """Raise ``RingFailed`` unless every chip's loop thread is running; ``ChipUnresponsive`` if a
        chip's actor did not answer within ``timeout_s`` (alive or not: the caller decides how long
        to wait before it counts as gone)."""
        try:
            states = ray.get([w.alive.remote() for w in self._workers], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise ChipUnresponsive(f"a chip did not answer within {timeout_s:g} s") from e
        except Exception as e:  # noqa: BLE001 - a dead actor
            raise RingFailed(f"a chip is gone: {type(e).__name__}: {e}") from e
        for chip, (alive, err) in zip(self.layout, states, strict=True):
            if not alive:
                raise RingFailed(f"chip {chip.chip} stopped: {err}")

    def shutdown(self) -> None:
        """Stop the ring, kill the actors, remove the placement groups (and Ray if started here); idempotent."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.send(("stop",))
            self._client.close()
            self._client = None
        for w in self._workers:
            ray.kill(w, no_restart=True)
        self._workers = []
        release(self._groups)
        self._groups = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
