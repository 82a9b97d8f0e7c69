"""``ChipWorker``: the Ray actor that is one chip, holding one shard (a TP rank of a pipeline stage).

A worker loads only its shard (``load_model`` with its layer range and TP rank), keeps the KV
cache of those layers and kv heads, and joins its stage's tensor-parallel process group (gloo on
CPU, NCCL on GPU; one group per stage, so it is the process's default group). Then
``sharding.pipeline`` wires the chips into a ring (``listen``, ``connect``, ``start``) and from
there on the chip runs the loop of ``sharding.ring`` in a thread of its own: Ray carries no
per-token traffic.

Threads: a chip computes with as many torch threads as the cores it owns (``threads``; one on a
CPU machine where a chip is a core), so chips sharing a machine do not oversubscribe it.
"""

from __future__ import annotations

import socket
import threading

import ray
import torch
import torch.distributed as dist

from . import cpus

from .packed import resolve as resolve_packed
from .ring import Chip, ChipRole, Head
from .stage import StageRunner
from .transport import SPIN_S, Link, accept, listen
from .weights import load_model


class ChipWorker:
    """One chip (create with ``ray.remote`` options, see ``sharding.pipeline``).

    Args:
        index: the chip's position in the layout (``stage * tp + tp_rank``).
        stage, num_stages: its pipeline stage, and how many there are.
        tp_rank, tp_size: its rank in the stage's tensor-parallel group.
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads (CPU): the cores this chip owns.
        spin_s: how long the chip polls its incoming links before sleeping (``sharding.transport``).
    """

    def __init__(self, *, index: int, stage: int, num_stages: int, tp_rank: int, tp_size: int,
                 device: str = "cpu", threads: int = 1, spin_s: float = SPIN_S) -> None:
        self.node_ip = ray.util.get_node_ip_address()
        self.index, self.spin_s = index, spin_s
        self.role = ChipRole(f"{self.node_ip}/chip{index}", stage, tp_rank, tp_size, num_stages)
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, threads))
            # Loading and compiling on every CPU of the node; ``place`` moves it to the compute cores
            # once warm (FASTMODE_CPUS, sharding/cpus.py).
            cpus.unplace()
        self._max_chips = num_stages * tp_size * max(1, threads)
        self.runner: StageRunner | None = None
        self._server: socket.socket | None = None
        self._control: socket.socket | None = None
        self._out: dict[int, Link] = {}
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self.head: Head | None = None

    def place(self) -> tuple[int, ...] | None:
        """Run this chip on the compute cores if its layout's chips fit there, else on every CPU of
        the node (FASTMODE_CPUS, ``sharding.cpus``): called once the ring is warm. Returns the CPUs,
        or ``None`` where nothing is placed."""
        if self.device.type != "cpu":
            return None
        return cpus.place("compute", max_chips=self._max_chips)

    def chip_id(self) -> tuple[str, str]:
        """``(chip id, node ip)``."""
        return self.role.chip, self.node_ip

    def rendezvous(self) -> str:
        """(TP rank 0) the ``tcp://`` address its stage's process group meets at."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{self.node_ip}:{port}"

    def setup(self, path: str, *, layer_range: tuple[int, int], init_method: str | None,
              num_slots: int, max_len: int | None, dtype: torch.dtype, compile: bool = False,
              packed_weights: bool | str = False, kv_cache_bytes: int | None = None,
              vocab: list[int] | None = None, keep_prompt: bool = False) -> int:
        """Join the stage's TP group (if ``tp_size > 1``), then load the shard and build its cache
        (``vocab``: the ids the head keeps, on the stage with it, and ``keep_prompt``: each
        request's prompt tokens too; ``StageRunner``).

        All ranks of a stage must call this concurrently (joining the group blocks until all do).
        """
        group = None
        if self.role.tp > 1:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=init_method, rank=self.role.tp_rank,
                                    world_size=self.role.tp)
            group = dist.group.WORLD
        model = load_model(path, layer_range=layer_range, tp_rank=self.role.tp_rank, tp_size=self.role.tp,
                           tp_group=group, dtype=dtype, device=self.device)
        packed = resolve_packed(packed_weights, self.device, dtype)  # this chip's CPU decides "auto"
        self.runner = StageRunner(model, num_slots=num_slots, max_len=max_len, compile=compile,
                                  packed_weights=packed, kv_cache_bytes=kv_cache_bytes, vocab=vocab,
                                  keep_prompt=keep_prompt)
        return self.runner.packed_linears

    # -- wiring the ring (sharding.pipeline calls these in order, on every chip) ---------------
    def listen(self) -> tuple[str, int, int | None]:
        """Open this chip's listening socket(s): ``(host, ring port, client port or None)``."""
        self._server = listen(self.node_ip)
        client_port = None
        if self.role.is_head:
            self._control = listen(self.node_ip)
            client_port = self._control.getsockname()[1]
        return self.node_ip, self._server.getsockname()[1], client_port

    def connect(self, targets: list[tuple[int, str, int]]) -> None:
        """Open this chip's outgoing links: ``(receiver index, host, port)`` each."""
        for index, host, port in targets:
            self._out[index] = Link.connect(host, port, hello=self.index)

    def start(self, expected: dict[str, list[int]], prefix_cache: bool = False, secret: bytes | None = None,
              door=None) -> tuple[str, int] | None:
        """Accept the incoming links and start the loop thread.

        ``expected``: ``{"prev": [index]}`` for a follower, ``{"returns": [indices]}`` for the head;
        ``prefix_cache``: the head's scheduler parks finished sequences' slots for reuse;
        ``secret``: what the head's clients must send first (``sharding.ring.Head``);
        ``door``: (the head) what opens a front door in its loop (``open(model_config, max_len)``, as
        ``serve.lanes.door.DoorSpec``). Answers the door's ``(host, port)``, or ``None``.
        """
        want = [i for ids in expected.values() for i in ids]
        got = accept(self._server, len(want))
        for link in got.values():
            link.spin_s = self.spin_s
        if sorted(got) != sorted(want):
            raise RuntimeError(f"chip {self.index} expected links from {sorted(want)}, got {sorted(got)}")
        self._server.close()
        links: dict = {}
        role = self.role
        nexts = [link for i, link in self._out.items() if i // role.tp == role.stage + 1]
        if nexts:
            links["next"] = nexts[0]
        if role.is_head:
            links["peers"] = [link for i, link in self._out.items() if 0 < i < role.tp]
            # Rank 0 of the last stage (the tokens) first.
            links["returns"] = [got[i] for i in sorted(expected["returns"])]
            opened = None if door is None else door.open(self.runner.model.config, self.runner.cache.max_len)
            chip = self.head = Head(role, self.runner, links, self._control, prefix_cache=prefix_cache,
                                    secret=secret, spin_s=self.spin_s, door=opened)
            target = chip.lead
        else:
            links["prev"] = got[expected["prev"][0]]
            if role.is_last:
                links["ret"] = self._out[0]
            chip = Chip(role, self.runner, links)
            target = chip.follow
        self._thread = threading.Thread(target=self._run, args=(target,), name=f"ring-{role.chip}", daemon=True)
        self._thread.start()
        if role.is_head and chip.door is not None:
            host = chip.door.spec.host
            return (self.node_ip if host in ("0.0.0.0", "::", "") else host), chip.door.port
        return None

    def _run(self, target) -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - kept for ``alive``
            self._error = f"{type(e).__name__}: {e}"

    def prefix_stats(self) -> dict[str, int] | None:
        """(The head) its scheduler's prefix cache: ``parked``, ``hits``, ``reused_tokens``; ``None`` if off."""
        prefix = self.head.scheduler.prefix if getattr(self, "head", None) is not None else None
        return None if prefix is None else prefix.stats()

    def ring_load(self) -> dict[str, int]:
        """(The head) requests in its scheduler, from every client (``running``), the clients
        connected (``clients``: a door's connections too), the requests dropped before their end since
        start (``aborted``: ``sharding.ring.Head.aborted``), and with a door its ``connections`` and the
        responses it ``served`` to their end (``door``; else ``None``)."""
        head = getattr(self, "head", None)
        if head is None:
            return {"running": 0, "clients": 0, "aborted": 0, "door": None}
        door = None if head.door is None else {"connections": len(head.door.connections), "served": head.door.served}
        return {"running": head.scheduler.num_unfinished, "clients": len(head.clients), "aborted": head.aborted,
                "door": door}

    def clear_prefix(self) -> None:
        """(The head, on an idle ring) free every parked slot."""
        scheduler = self.head.scheduler if getattr(self, "head", None) is not None else None
        if scheduler is not None:
            scheduler.clear_prefix()

    def alive(self) -> tuple[bool, str | None]:
        """Whether the loop thread runs, and the error it ended with."""
        return self._thread is not None and self._thread.is_alive(), self._error

    @torch.inference_mode()
    def prompt_logits(self, prompt: list[int], slot: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Debug, on an idle ring: this shard's ``StageRunner.prompt_logits`` (stage 0 takes
        ``prompt``, later stages the previous stage's ``hidden``)."""
        first = self.role.stage == 0
        out = self.runner.prompt_logits(torch.tensor(prompt) if first else None, slot,
                                        None if first else hidden.to(self.device))
        return out.cpu()
