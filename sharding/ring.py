"""The decode loop on the chips: a ring of stages, with the scheduler on the first chip.

Every chip runs one loop thread. The *head* (stage 0, TP rank 0) holds the ``Scheduler``. Each
step it admits waiting requests, embeds and runs its layers, and sends the step on. The last stage
samples and sends the tokens straight back to the head, which closes the ring:

    client --add/abort--> head (stage 0, rank 0) --hidden--> stage 1 --> ... --> last stage
              <--tokens--   ^                                                    | samples
                            +--------------------------- tokens -----------------+

- TP rank r of stage s sends to rank r of stage s+1; every rank holds the whole hidden state
  after its layers' all-reduce. The head sends each step's token ids to its own stage's other
  ranks. Every rank of the last stage reports back to the head: rank 0 with the tokens, the
  others with the hops they saw.
- Per-request data travels once: a request's ``SamplingParams`` ride in the step that admits it
  (``StepBatch.admit``; its prompt ids too when a repetition penalty reads them), and the last
  stage keeps them by KV-cache slot until the slot is freed, with the token history its sampling
  needs (``sharding.sampling.History``, fed by the tokens it samples).
- Every hop is timed by its receiver (``Hop``); the head passes each step's hops to the client
  with its tokens (``StepInfo``), one message per step.
- The head answers its clients (``sharding.pipeline.ShardedModel``'s own, the lane replica's, and
  each front door's that streams from it directly) over one TCP link each, opened with the ring's
  secret: requests and aborts come in, each request's outputs go back to the client that added it
  (every few steps, ``FLUSH_S``; first tokens and ends at once). Between steps the head drains what
  came in, so a request joins or leaves the batch, or is cancelled, within one step. With nothing
  to do, every chip blocks in ``recv``/``select`` and uses no CPU.

Nothing per token goes through Ray: Ray places the chips and wires the links, then steps are
plain socket messages (``sharding.transport``).
"""

from __future__ import annotations

import hmac
import select
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from .batch import Hop, Rows, StepBatch, StepResult
from .kv_cache import SlotPool
from .scheduler import Scheduler
from .stage import StageRunner
from .transport import Link, LinkClosed, poll

TRANSPORT = "tcp"
FLUSH_S = 0.010
"""How often the head sends its client the outputs of the steps since the last send (a
request's first token and its end are sent at once). Each message wakes the client, whose
process shares the machine with the chips; 10 ms bundles several decode steps of the fast model,
well inside a lane's own coalescing window (``stream_interval_ms``, 50 ms by default)."""
HELLO_TIMEOUT_S = 10.0
"""How long a new client connection has to send the head's secret before it is closed."""
SECRET_BYTES = 32

HopTuple = tuple[str, str, int, int, int, float, int]
"""A ``Hop`` as it travels: ``(src_chip, dst_chip, src_stage, dst_stage, bytes, seconds, received_at)``."""


@dataclass(frozen=True)
class StepInfo:
    """One ring step as the head saw it: wall-clock bounds (``time.time_ns``), rows, hops."""

    start_ns: int
    end_ns: int
    batch_size: int
    hops: list[Hop]
    stage_seconds: list[float]
    """Compute seconds of each stage (its rank 0)."""


@dataclass(frozen=True)
class ChipRole:
    """Where a chip sits in the ring."""

    chip: str
    stage: int
    tp_rank: int
    tp: int
    pp: int

    @property
    def is_head(self) -> bool:
        return self.stage == 0 and self.tp_rank == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1

    def inbound(self) -> int:
        """How many links arrive at this chip (the head's client link is not counted)."""
        if self.is_head:
            return self.tp if self.pp > 1 else self.tp - 1  # every last-stage rank but itself
        return 1  # from the head (stage 0) or from the same rank of the previous stage


def ring_links(tp: int, pp: int) -> list[tuple[int, int]]:
    """Every link of the ring as ``(sender index, receiver index)``, chip index = ``stage * tp + rank``."""
    links = [(0, r) for r in range(1, tp)]  # the head's token ids to its stage's other ranks
    links += [(s * tp + r, (s + 1) * tp + r) for s in range(pp - 1) for r in range(tp)]
    links += [((pp - 1) * tp + r, 0) for r in range(tp) if (pp - 1) * tp + r != 0]  # back to the head
    return links


# -- step messages ---------------------------------------------------------------------------
def _rows_tensors(parts: list[Rows]) -> list[torch.Tensor]:
    """One int64 tensor per part: positions ``[B*S]``, slots ``[B]``, last ``[B]``, concatenated."""
    return [torch.cat((r.positions.view(-1), r.slots, r.last)) for r in parts]


def _rows_of(desc: list[tuple[int, int, int]], tensors: list[torch.Tensor]) -> list[Rows]:
    rows = []
    for (B, S, context), t in zip(desc, tensors, strict=False):
        rows.append(Rows(None, t[:B * S].view(B, S), t[B * S:B * S + B], t[B * S + B:], context))
    return rows


def _hop(meta: dict, role: ChipRole, nbytes: int, arrived: int) -> HopTuple:
    # Two processes' wall clocks: NTP steps (or a sandbox's per-process clock) can put the receiver
    # a hair behind the sender; a negative duration means "too short to see", so it reads as 0.
    seconds = max(0, arrived - meta["sent_at"]) / 1e9
    return (meta["src"], role.chip, meta["src_stage"], role.stage, nbytes, seconds, arrived)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Chip:
    """One chip's side of the ring: its role, its runner, its links (see the module docstring).

    Args:
        role: where it sits.
        runner: its shard's ``StageRunner`` (model and KV cache).
        links: ``"prev"`` (from the head or the previous stage), ``"next"`` (to the next stage),
            ``"peers"`` (the head: to its stage's other ranks), ``"returns"`` (the head: from every
            last-stage rank but itself, rank 0's first), ``"ret"`` (a last-stage rank: to the head).
    """

    def __init__(self, role: ChipRole, runner: StageRunner, links: dict[str, Any]) -> None:
        self.role, self.runner, self.links = role, runner, links

    @torch.inference_mode()
    def follow(self) -> None:
        """A chip other than the head: receive, compute, send on, until the link closes."""
        role, prev = self.role, self.links["prev"]
        try:
            while True:
                meta, tensors = prev.recv()
                arrived = time.time_ns()
                if meta is None:  # the head stopped: pass it on
                    if "next" in self.links:
                        self.links["next"].send(None)
                    return
                desc = meta["desc"]
                parts, xs = _rows_of(desc, tensors), tensors[len(desc):]
                hops = meta["hops"] + [_hop(meta, role, _nbytes(xs), arrived)]
                start = time.perf_counter()
                if role.stage == 0:  # a TP peer of the head: token ids
                    for r, x in zip(parts, xs, strict=True):
                        r.tokens = x
                    xs = None
                if not role.is_last:
                    hidden = self.runner.forward(parts, xs)
                    onward = {**meta, "hops": hops, "secs": meta["secs"] + [time.perf_counter() - start],
                              "sent_at": time.time_ns(), "src": role.chip, "src_stage": role.stage}
                    self.links["next"].send(onward, tensors[:len(desc)] + hidden)
                    continue
                if role.tp_rank == 0:  # before the logits: a cut head's prompt rows come with it
                    self.runner.admit(StepBatch(admit=meta["admit"], freed=meta["freed"], prompts=meta["prompts"]))
                logits = self.runner.logits(parts, xs)  # every rank: the head all-gathers
                tokens, logprobs = None, {}
                if role.tp_rank == 0:
                    tokens, logprobs = self.runner.sample(parts, logits)
                self.links["ret"].send({"step": meta["step"], "tokens": tokens, "logprobs": logprobs, "hops": hops,
                                        "secs": meta["secs"] + [time.perf_counter() - start],
                                        "sent_at": time.time_ns(), "src": role.chip, "src_stage": role.stage})
        except LinkClosed:
            return  # the ring is being torn down (or a neighbour died: the head reports it)
        finally:
            for link in self.links.values():
                for one in link if isinstance(link, list) else [link]:
                    one.close()


class Head(Chip):
    """The head chip: scheduler, first stage, and its clients' links (see the module docstring).

    Several clients may be connected at once (the lane replica that owns the ring, and each front
    door that streams from the head itself: ``serve.lanes.head_links``). Each request belongs to the
    client that added it: its outputs and errors go there, and a client that goes away takes only
    its own requests with it. A client must open with ``secret`` (when one is set); anything else
    is closed unread.

    Args:
        role, runner, links: as for ``Chip``.
        server: the listening socket its clients connect to.
        flush_s: outputs leave at most this often (a first token or an end at once).
        prefix_cache: the scheduler parks finished sequences' slots (``sharding.prefix_cache``).
        secret: the bytes a client must send first (``None``: no handshake).
        spin_s: with nothing to do, the head polls its clients' links this long after its last
            step before it sleeps (as every chip polls its ring links, ``sharding.transport.Link``): a
            client's next request often comes within a round trip of the last one's end, and a head
            that slept pays the wake-up and runs its step colder (``bench.ttft_idle``).
    """

    def __init__(self, role: ChipRole, runner: StageRunner, links: dict[str, Any], server,
                 flush_s: float = FLUSH_S, prefix_cache: bool = False, secret: bytes | None = None,
                 spin_s: float = 0.0, door=None) -> None:
        super().__init__(role, runner, links)
        self.server, self.flush_s, self.secret, self.spin_s = server, flush_s, secret, spin_s
        self.door = door
        if door is not None:
            door.abort = self._abort
        self._outputs: list[tuple] = []
        self._infos: list[tuple] = []
        self._flushed = 0.0
        self.scheduler = Scheduler(runner.model.config, SlotPool(runner.cache.num_slots), runner.cache.max_len,
                                   prefix_cache=prefix_cache)
        self.clients: dict[socket.socket, Link] = {}
        self._hellos: dict[socket.socket, tuple[bytearray, float]] = {}
        """Connections that have not yet sent the whole secret: what came so far, and a deadline."""
        self._owner: dict[str, Link] = {}
        self.steps = 0
        self.aborted = 0
        """Requests dropped before their end: a client's abort (a closed stream, a stop string) or
        its going away."""

    @torch.inference_mode()
    def lead(self) -> None:
        """Serve clients until a ``stop`` command (or a broken ring, reported as ``fatal``)."""
        try:
            while True:
                if not self._commands(block=not self.scheduler.has_work):
                    return
                batch = self.scheduler.schedule()
                if batch is None:
                    self._flush()
                    continue
                start = time.time_ns()
                result, hops, secs = self._step(batch)
                outputs = self.scheduler.postprocess(result)
                self._infos.append((start, time.time_ns(), len(outputs), hops, secs))
                self._outputs += [(o.request_id, o.token_ids[0], o.finished, o.finish_reason, o.cached,
                                   o.logprobs[0] if o.logprobs else None) for o in outputs]
                # A request's first token and its end leave at once; the rest at most every flush_s.
                if (batch.prefill is not None or any(o.finished for o in outputs) or not self.scheduler.has_work
                        or time.perf_counter() - self._flushed >= self.flush_s):
                    self._flush()
        except BaseException as e:  # noqa: BLE001 - the clients hear of it, then the ring stops
            for client in list(self.clients.values()):
                self._send(client, ("fatal", f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)))
        finally:
            for name in ("next", "peers"):
                for link in self._list(name):
                    try:
                        link.send(None)
                    except LinkClosed:
                        pass
            for link in [*self._list("next"), *self._list("peers"), *self._list("returns")]:
                link.close()
            for client in self.clients.values():
                client.close()
            for sock in self._hellos:
                sock.close()
            self.server.close()
            if self.door is not None:
                self.door.close()

    def _flush(self) -> None:
        """Send each client the outputs of its requests since the last flush, with the steps'
        infos; ``report`` is true for one client only (its lane counts the steps in its metrics)."""
        if self._infos:
            per: dict[Link, list[tuple]] = {}
            for out in self._outputs:
                client = self._owner.get(out[0])
                if client is not None:
                    per.setdefault(client, []).append(out)
                    if out[2]:  # finished
                        del self._owner[out[0]]
            if not per and self.clients:
                per[next(iter(self.clients.values()))] = []
            report = True
            for client, outs in per.items():
                self._send(client, ("out", outs, self._infos, report))
                report = False
            self._outputs, self._infos = [], []
        if self.door is not None:
            for conn in self.door.flush():
                self._lost_client(conn)
        self._flushed = time.perf_counter()

    def _list(self, name: str) -> list[Link]:
        v = self.links.get(name, [])
        return v if isinstance(v, list) else [v]

    def _send(self, client: Link, msg: tuple) -> None:
        if client.sock not in self.clients:
            return
        try:
            client.send(msg)
        except Exception:  # noqa: BLE001 - gone (LinkClosed), or a client's fault: it goes, the ring serves on
            self._lost_client(client)

    def _lost_client(self, client: Link) -> None:
        """A client went away: drop its requests (their slots free at the next step)."""
        self.clients.pop(client.sock, None)
        client.close()
        for rid in [rid for rid, owner in self._owner.items() if owner is client]:
            del self._owner[rid]
            self.aborted += self.scheduler.abort(rid)

    def _abort(self, rid: str) -> None:
        """Drop one request (its slot frees at the next step), whoever added it."""
        if self._owner.pop(rid, None) is not None:
            self.aborted += self.scheduler.abort(rid)

    def _wait(self, block: bool) -> list[socket.socket]:
        """The sockets with something to read: a new connection, a secret's bytes, a command."""
        door = self.door
        watched, timeout = [self.server, *self._hellos, *self.clients], 0.0
        if door is not None:
            watched.append(door.server)
        if block and self.spin_s > 0 and poll(watched, self._flushed + self.spin_s):
            block = False  # something came within the window after the last step
        if block:
            deadlines = [d for _, d in self._hellos.values()]
            if door is not None and (d := door.deadline()) is not None:
                deadlines.append(d)
            timeout = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
        ready, writable, _ = select.select(watched, door.want_write() if door is not None else [], [], timeout)
        now = time.monotonic()
        for sock, (_, deadline) in list(self._hellos.items()):
            if deadline <= now and sock not in ready:
                del self._hellos[sock]
                sock.close()
        if door is not None:
            for conn in door.writable(writable) + door.expired(now):
                self._lost_client(conn)  # a dropped one's socket in ``ready`` is skipped: no client
        return ready

    def _hello(self, sock: socket.socket) -> None:
        """Read what came of a new connection's secret; it becomes a client once the secret is whole."""
        got, deadline = self._hellos[sock]
        try:
            chunk = sock.recv(len(self.secret) - len(got), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        got += chunk
        if not chunk or not hmac.compare_digest(bytes(got), self.secret[:len(got)]):
            del self._hellos[sock]
            sock.close()
        elif len(got) == len(self.secret):
            del self._hellos[sock]
            self.clients[sock] = Link(sock, spin_s=0)

    def _commands(self, block: bool) -> bool:
        """Apply what the clients sent (waiting for something if ``block``); ``False`` on ``stop``."""
        while True:
            ready = self._wait(block)
            if not ready:
                return True
            block = False
            for sock in ready:
                if self.door is not None and sock is self.door.server:
                    if (conn := self.door.accept()) is not None:
                        self.clients[conn.sock] = conn
                elif sock is self.server:
                    conn, _ = self.server.accept()
                    if self.secret:
                        self._hellos[conn] = (bytearray(), time.monotonic() + HELLO_TIMEOUT_S)
                    else:
                        self.clients[conn] = Link(conn, spin_s=0)
                elif sock in self._hellos:
                    self._hello(sock)
                elif sock in self.clients and not self._command(self.clients[sock]):
                    return False

    def _command(self, client: Link) -> bool:
        """Apply what ``client`` sent (one message of a ``Link``); ``False`` on ``stop``."""
        try:
            msgs = client.read_messages()
        except Exception:  # noqa: BLE001 - gone (LinkClosed), or what it sent cannot be read: it goes
            self._lost_client(client)
            return True
        for msg in msgs:
            if not self._apply(client, msg):
                return False
        return True

    def _apply(self, client: Link, msg: tuple) -> bool:
        kind = msg[0]
        if kind == "add":
            _, rid, prompt, params = msg
            try:
                self.scheduler.add(rid, prompt, params)
                self._owner[rid] = client
            except Exception as e:  # noqa: BLE001 - the request's own fault, reported to it alone
                self._send(client, ("error", rid, e))
        elif kind == "abort":
            if self._owner.get(msg[1]) is client:
                del self._owner[msg[1]]
                self.aborted += self.scheduler.abort(msg[1])
        elif kind == "stop":
            return False
        return True

    def _step(self, batch: StepBatch) -> tuple[StepResult, list[HopTuple], list[float]]:
        role, parts = self.role, batch.parts()
        self.steps += 1
        desc = [(r.num_rows, int(r.positions.shape[1]), r.context) for r in parts]
        rows = _rows_tensors(parts)
        meta = {"step": self.steps, "desc": desc, "admit": batch.admit, "freed": batch.freed,
                "prompts": batch.prompts, "hops": [],
                "secs": [], "sent_at": time.time_ns(), "src": role.chip, "src_stage": 0}
        tokens = [r.tokens for r in parts]
        for peer in self._list("peers"):
            peer.send(meta, rows + tokens)
        start = time.perf_counter()
        if role.pp > 1:
            hidden = self.runner.forward(parts)
            meta = {**meta, "secs": [time.perf_counter() - start], "sent_at": time.time_ns()}
            self.links["next"].send(meta, rows + hidden)
            sampled, logprobs, hops, secs = None, {}, [], []
        else:
            self.runner.admit(batch)  # first: a cut head's prompt rows come with it
            logits = self.runner.logits(parts)
            (sampled, logprobs), hops, secs = self.runner.sample(parts, logits), [], [time.perf_counter() - start]
        for link in self._list("returns"):
            back, _ = link.recv()
            arrived = time.time_ns()
            n = sum(len(t) for t in back["tokens"]) if back["tokens"] is not None else 0
            hops += back["hops"] + [_hop(back, role, 8 * n, arrived)]
            if back["tokens"] is not None:
                sampled, logprobs, secs = back["tokens"], back["logprobs"], back["secs"]
        return StepResult.of_parts(batch, sampled, logprobs=logprobs), hops, secs


def step_infos(infos: list[tuple]) -> list[StepInfo]:
    """The steps' ``info`` as sent by the head -> ``StepInfo``s with ``Hop`` records."""
    return [StepInfo(start, end, size, [Hop(*h[:5], h[5], TRANSPORT, h[6]) for h in hops], secs)
            for start, end, size, hops, secs in infos]
