"""Speculative decoding: the fast model drafts ``k`` tokens, the full model verifies them in one
forward pass, and the output is the full model's own.

Each round, for every running sequence:

1. **Draft**: the draft model decodes ``k`` tokens one at a time (``d1 .. dk``), greedily or by
   sampling from its own distribution ``q``.
2. **Verify**: the target model runs ``[last, d1 .. dk]`` as one row of ``k + 1`` tokens (the same
   path as a prefill, over the cache it already holds) and yields its distribution ``p`` at every
   position.
3. **Accept** (``accept_greedy`` / ``accept_sampled``): the longest prefix of the drafts the target
   agrees with, then one token of the target's own: the correction at the first disagreement, or a
   bonus token after ``dk``. Greedy: a draft is kept when it is the target's argmax, so the output is
   token for token the target's greedy output. Sampled: the standard rejection rule (Leviathan et
   al., 2023; Chen et al., 2023) keeps ``d`` with probability ``min(1, p(d) / q(d))`` and otherwise
   draws from ``norm(max(p - q, 0))``, so every token follows the target's distribution (after its
   temperature and top-p) exactly.

Every sampling parameter keeps this exact (``sharding.sampling``): both models' logits at a position
go through the same processing before the argmax or the rule, the history-dependent part
(``min_tokens``, ``logit_bias``, the penalties) with the sequence's tokens up to that position, the
drafts before it included (a ``History`` copied per round). At each position the target's processed
distribution is then the one it would sample alone, given the tokens before it, as in vLLM's
rejection sampler.

A round therefore makes between 1 and ``k + 1`` tokens for one target forward and ``k`` draft
forwards. Nothing is rolled back in the KV caches: positions past a sequence's accepted tokens are
overwritten before they are read (``sharding.kv_cache``). Invariant between rounds: the target's
cache holds every token of the sequence but the last; the draft's holds all but ``pending``: the
last one, or ``[dk, bonus]`` after a round that accepted all ``k`` drafts, or every token of the
plain rounds since it last drafted.

``k`` adapts per round (``adaptive``): from the acceptance rate seen so far and the measured cost
of a draft step against a verify step, it picks the ``k`` that maximizes expected tokens per
second, ``(1 - a**(k+1)) / (1 - a) / (t_verify + k * t_draft)``, or ``k = 0``, a plain decode step
of the target alone (``1 / t_plain``), when drafts are accepted too rarely to pay for themselves.
While it decodes plainly, every ``PROBE_EVERY``-th round drafts one token, so the acceptance and the
draft's cost are still measured (the draft first catches up on the tokens it has not seen, in one
forward). A seeded sampled request draws the same tokens again only for the same sequence of
``k``s, so while one is in the batch ``k`` stays at its start value (timings never decide it): its
tokens are reproducible; greedy output is always the same.

With ``draft_vocab``, the draft's head is cut to the tokens it drafts most (``sharding.draft_vocab``):
cheaper draft steps, the same output.

With ``prefix_cache`` on, a finished sequence's slot is parked with the tokens the target's cache
holds (``sharding.prefix_cache``), and a later prompt that continues them (a conversation's next
turn) prefills only the rest: in the target, past what it held; in the draft, past what the draft
held (less, when the sequence ended in plain rounds).
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .batch import Rows
from .draft_vocab import expand, prune_head, vocab_ids
from .errors import DuplicateRequest, InvalidLayout
from .kv_cache import SlotPool, fit_max_len
from .model import Llama
from .prefix_cache import PrefixCache, place, release
from .sampling import History, SamplingParams, generator_for_seed, params_per_prompt, token_logprobs, warp
from .scheduler import StepOutput, prefill_rows, validate_request
from .stage import StageRunner
from .weights import load_model

K_MAX = 8
"""The most drafts per round."""
PROBE_EVERY = 16
"""While ``adaptive`` decodes plainly (``k = 0``), one round in this many drafts one token."""


class DraftMismatch(InvalidLayout):
    """The draft model cannot draft for the target (another vocabulary)."""


@dataclass
class SpecStats:
    """One sequence's (or the engine's) speculative rounds: drafts made, drafts accepted, tokens."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    """Rounds in which the target refused a draft (the rest accepted all of theirs)."""
    tokens: int = 0

    @property
    def acceptance(self) -> float | None:
        """Accepted drafts / drafted (``None`` before any draft)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def per_position(self) -> float | None:
        """The chance that a draft is accepted given the ones before it were: accepted drafts /
        (accepted + refused), the ``a`` of ``best_k``."""
        seen = self.accepted + self.rejections
        return self.accepted / seen if seen else None

    @property
    def tokens_per_round(self) -> float | None:
        """Tokens produced per target forward."""
        return self.tokens / self.rounds if self.rounds else None

    def add(self, drafted: int, accepted: int, tokens: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += accepted < drafted
        self.tokens += tokens


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    slot: int
    gen: torch.Generator | None
    history: History | None = None
    """The tokens its logits processing looks at (``SamplingParams.uses_history``), else ``None``."""
    output: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    """Tokens the draft model has not cached yet (the last one, or ``[dk, last]``)."""
    stats: SpecStats = field(default_factory=SpecStats)
    cached: int = 0
    """Prompt tokens whose keys and values the slot already held (a prefix-cache hit)."""
    draft_cached: int = 0
    """Of those, the ones the draft's cache held too (fewer after plain rounds, ``pending``)."""
    valid: int = 0
    """Leading tokens of the sequence whose keys and values the target's cache holds."""
    draft_valid: int = 0
    """The same in the draft's cache (``valid`` minus what is ``pending`` beyond the last token)."""

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.output)


# -- the acceptance rules ------------------------------------------------------------------------
def accept_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """``(accepted, next_token)`` for one row: ``drafts [k]``, ``target_logits [k + 1, V]``."""
    g = target_logits.argmax(dim=-1).to(drafts.device)  # the drafts are kept on the CPU, the logits may not be
    k = int(drafts.shape[0])
    agree = (drafts == g[:k]).int()
    a = int(agree.cumprod(0).sum()) if k else 0
    return a, int(g[a])


def accept_sampled(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                   gen: torch.Generator | None) -> tuple[int, int]:
    """``(accepted, next_token)`` for one row by the rejection rule.

    ``drafts [k]`` were drawn from ``q [k, V]`` (the draft's warped distributions); ``p [k + 1, V]``
    are the target's at the same positions and one more.
    """
    k = int(drafts.shape[0])
    for i in range(k):
        d = int(drafts[i])
        u = torch.rand((), generator=gen, device=p.device)
        if float(u) * float(q[i, d]) < float(p[i, d]):  # u < p/q, without dividing by a zero q
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if float(total) > 0 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=gen))
    return k, int(torch.multinomial(p[k], 1, generator=gen))


def processed_positions(history: History, logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """``logits: [n, V]`` of a sequence's next ``n`` positions as float32, row ``i`` processed by
    ``history`` followed by ``tokens[:i]`` (the drafts before that position); ``history`` is not changed."""
    h, out = history.copy(), logits.float().clone()
    for i in range(out.shape[0]):
        h.apply(out[i])
        if i < len(tokens):
            h.append(tokens[i:i + 1])
    return out


def best_k(per_position: float, t_draft: float, t_verify: float, k_max: int = K_MAX,
           t_plain: float | None = None) -> int:
    """The ``k`` in ``1 .. k_max`` that maximizes expected tokens per second of a round, each draft
    accepted with chance ``per_position`` if the ones before it were; with ``t_plain`` (seconds of a
    plain decode step of the target), 0 where plain decoding is faster than any ``k``."""
    a = min(max(per_position, 0.0), 0.999)

    def rate(k: int) -> float:
        if k == 0:
            return 1 / t_plain
        return (1 - a ** (k + 1)) / (1 - a) / (t_verify + k * t_draft)

    return max(range(0 if t_plain else 1, k_max + 1), key=rate)


# -- the engine ----------------------------------------------------------------------------------
class SpeculativeEngine:
    """The target model's output, drafted by a smaller model, for a batch of sequences in process.

    Args:
        target: the full model (whole: embedding and head).
        draft: the draft model; same vocabulary as the target.
        num_slots: sequences decoded at once (each holds a KV-cache slot in both models).
        max_len: tokens per sequence; default: what both models' caches fit (``KVCache.for_model``),
            within the smaller of their contexts. kv_cache_bytes: each model's cache budget.
        k: drafts per round (with ``adaptive``, the start value and the most it may choose).
        adaptive: choose ``k`` in ``0 .. k`` each round from the acceptance and step costs measured
            so far (0, a plain step, where drafting does not pay).
        compile: run both models under ``torch.compile`` (``sharding.stage``).
        compile_regions: with ``compile``, each model compiles one decoder layer for all of them
            (``sharding.stage.compile_forward``'s ``regions``): a warm-up of minutes, not tens of
            minutes, on a 30-layer target, for somewhat slower steps.
        prefix_cache: park finished sequences' slots for prompts that continue them.
        packed_weights: both models read small steps' weights as bfloat16 (``sharding.packed``):
            the same tokens; a verify step streams half the bytes.
        draft_vocab: the token ids the draft may propose (``sharding.draft_vocab``): its head is cut
            to those rows, so each draft step is cheaper; the output is the same. ``None``: the
            whole vocabulary.
    """

    def __init__(self, target: Llama, draft: Llama, *, num_slots: int = 2, max_len: int | None = None,
                 k: int = 4, adaptive: bool = True, compile: bool = False, compile_regions: bool = False,
                 prefix_cache: bool = False, packed_weights: bool = False, kv_cache_bytes: int | None = None,
                 draft_vocab: torch.Tensor | None = None) -> None:
        if target.config.vocab_size != draft.config.vocab_size:
            raise DraftMismatch(f"the draft model's vocabulary ({draft.config.vocab_size}) is not the "
                                f"target's ({target.config.vocab_size})")
        if not 0 <= k <= K_MAX:
            raise InvalidLayout(f"k must be in [0, {K_MAX}], got {k}")
        if max_len is None:
            max_len = min(_fit(m, num_slots, kv_cache_bytes) for m in (target, draft))
        self.config = target.config
        self.draft_vocab = None if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long)
        """The ids the draft's pruned head proposes (its logit ``j`` is token ``draft_vocab[j]``), or
        ``None``: its whole vocabulary."""
        if self.draft_vocab is not None:
            ids = self.draft_vocab
            if ids.ndim != 1 or not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= target.config.vocab_size \
                    or len(ids.unique()) != len(ids):
                raise InvalidLayout(f"draft_vocab must be distinct token ids of the vocabulary "
                                    f"(0 .. {target.config.vocab_size - 1})")
            prune_head(draft, ids)  # before packing and compiling
        self.target = StageRunner(target, num_slots=num_slots, max_len=max_len, compile=compile,
                                  compile_regions=compile_regions, packed_weights=packed_weights,
                                  kv_cache_bytes=kv_cache_bytes)
        self.draft = StageRunner(draft, num_slots=num_slots, max_len=max_len, compile=compile,
                                 compile_regions=compile_regions, packed_weights=packed_weights,
                                 kv_cache_bytes=kv_cache_bytes)
        self.max_len = self.target.cache.max_len
        self.packed_linears = {"target": self.target.packed_linears, "draft": self.draft.packed_linears}
        """Linears of each model running from packed bfloat16 weights (``sharding.packed``; 0: off)."""
        self.slots = SlotPool(num_slots)
        self.k, self.adaptive, self.k_start = k, adaptive, k
        self.stats = SpecStats()
        self.prefix: PrefixCache | None = PrefixCache() if prefix_cache else None
        self._draft_held: dict[int, int] = {}  # parked slot -> leading tokens its draft cache holds
        self.finished_stats: dict[str, SpecStats] = {}
        """The speculative rounds of the requests that finished in the latest ``step``."""
        self._t_draft = self._t_verify = self._t_plain = None  # seconds per forward, smoothed
        self._plain_rounds = 0  # rounds adaptive has decoded plainly since it last drafted
        self._waiting: list[_Seq] = []
        self._running: dict[str, _Seq] = {}

    @classmethod
    def from_pretrained(cls, target_path: str | Path, draft_path: str | Path, *,
                        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                        draft_vocab_size: int | str | None = None, **kw) -> SpeculativeEngine:
        """Both models from their folders. ``draft_vocab_size``: prune the draft's head to that many
        of its most frequent tokens (``sharding.draft_vocab``; the draft folder's token counts), or
        ``"auto"`` (``sharding.draft_vocab.resolve``)."""
        target, draft = (load_model(p, dtype=dtype, device=device) for p in (target_path, draft_path))
        ids = vocab_ids(draft_vocab_size, draft_path, draft.config.vocab_size, target.config.eos_token_ids)
        if ids is not None:
            kw["draft_vocab"] = torch.tensor(ids)
        return cls(target, draft, **kw)

    # -- requests ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        """Sequences decoding (holding a slot)."""
        return len(self._running)

    def validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Raise the typed error a request would get from ``add``, without queueing it."""
        validate_request(self.config, self.max_len, request_id, prompt, params)

    def add(self, request_id: str, prompt_ids: Seq[int], params: SamplingParams | None = None) -> None:
        """Queue a request (typed errors as ``Engine.add``)."""
        prompt, params = [int(t) for t in prompt_ids], params or SamplingParams()
        self.validate(request_id, prompt, params)
        if request_id in self._running or any(s.request_id == request_id for s in self._waiting):
            raise DuplicateRequest(f"request {request_id!r} is already in flight")
        gen = None if params.greedy else generator_for_seed(params.seed, self.target.device)
        history = History(params, prompt, self.config.vocab_size, self.config.eos_token_ids,
                          self.target.device) if params.uses_history else None
        self._waiting.append(_Seq(request_id, prompt, params, -1, gen, history))

    def abort(self, request_id: str) -> bool:
        for s in self._waiting:
            if s.request_id == request_id:
                self._waiting.remove(s)
                return True
        seq = self._running.pop(request_id, None)
        if seq is not None:
            self._release(seq)
        return seq is not None

    def _release(self, seq: _Seq) -> None:
        tokens = seq.prompt + seq.output
        n = min(seq.valid, len(tokens))
        if self.prefix is not None:
            self._draft_held[seq.slot] = min(seq.draft_valid, n)
        release(self.prefix, self.slots, seq.slot, tokens[:n])

    def prefix_stats(self) -> dict[str, int] | None:
        """The prefix cache's ``parked`` slots, ``hits`` and ``reused_tokens`` (``None``: off)."""
        return self.prefix.stats() if self.prefix is not None else None

    def request_stats(self, request_id: str) -> SpecStats | None:
        seq = self._running.get(request_id)
        return seq.stats if seq is not None else None

    # -- steps -------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        """Admit what fits and prefill it in both models (its first tokens), else one speculative
        round for the running sequences.

        Prefills go first, in a step of their own: a new request's first token waits for its own
        prefill and whatever step is under way, not for a round of the others as well (a
        conversation's next turn arriving while another decodes came 1.8x later than turn 1 on
        the served lane when a step was a round, then the prefill)."""
        self.finished_stats = {}
        admitted = []
        while self._waiting and (self.slots.num_free or self.prefix):
            seq = self._waiting.pop(0)
            seq.slot, seq.cached = place(self.prefix, self.slots, seq.prompt)
            seq.draft_cached = min(seq.cached, self._draft_held.pop(seq.slot, 0))
            admitted.append(seq)
        if admitted:
            return self._prefill(admitted)
        return self._round(list(self._running.values())) if self._running else []

    def _prefill(self, seqs: list[_Seq]) -> list[StepOutput]:
        rows = prefill_rows(seqs, self.max_len)  # each prompt past its cached prefix
        # The draft caches the prompt past what its own cache held; its logits are not needed.
        behind = any(s.draft_cached < s.cached for s in seqs)
        self.draft.feed([prefill_rows(seqs, self.max_len, [s.draft_cached for s in seqs]) if behind else rows])
        logits = self.target.logits([rows])[0]  # [B, V]
        out = []
        for i, seq in enumerate(seqs):
            self._running[seq.request_id] = seq
            seq.valid = seq.draft_valid = len(seq.prompt)
            row = logits[i] if seq.history is None else seq.history.apply(logits[i].float().clone())
            token = int(row.argmax()) if seq.params.greedy else int(
                torch.multinomial(warp(row, seq.params), 1, generator=seq.gen))
            lps = token_logprobs(logits[i:i + 1], [token], [seq.params.logprobs])
            out.append(self._emit(seq, [token], drafted=0, accepted=0, first=True, cached=seq.cached, logprobs=lps))
        return out

    def _k_for(self, seqs: list[_Seq]) -> int:
        k = self.k
        if any(not s.params.greedy and s.params.seed is not None for s in seqs):
            k = self.k_start  # a seeded sampled request's tokens depend on the ks: keep them fixed
        elif self.adaptive and self._t_draft and self._t_verify and self.stats.drafted >= 16:
            # Until a plain step is timed, a verify step's time stands for it (a slight overestimate).
            k = best_k(self.stats.per_position, self._t_draft, self._t_verify, k_max=self.k_start,
                       t_plain=self._t_plain or self._t_verify)
            self._plain_rounds = self._plain_rounds + 1 if k == 0 else 0
            if k == 0 and self._plain_rounds % PROBE_EVERY == 0:
                k = 1  # a probe: keep measuring the drafts
            self.k = k
        for s in seqs:  # never draft past max_tokens or the context
            k = min(k, s.params.max_tokens - len(s.output) - 1, self.max_len - s.length - 1)
        return max(k, 0)

    def _round(self, seqs: list[_Seq]) -> list[StepOutput]:
        k = self._k_for(seqs)
        B = len(seqs)
        slots = torch.tensor([s.slot for s in seqs])
        drafts = torch.zeros(B, k, dtype=torch.long)
        q = [[] for _ in seqs]  # the draft's warped distributions of sampled rows
        # 1. draft: the pending tokens (1 or 2 per row, right-padded), then one token at a time.
        if k:
            t0, graphs = time.perf_counter(), _graphs()
            width = max(len(s.pending) for s in seqs)
            tokens = torch.tensor([s.pending + [0] * (width - len(s.pending)) for s in seqs])
            start = torch.tensor([s.length - len(s.pending) for s in seqs])
            rows = Rows(tokens, start[:, None] + torch.arange(width), slots,
                        torch.tensor([len(s.pending) - 1 for s in seqs]), int((start + width).max()))
            lengths = [s.length for s in seqs]
            pos, last, top = torch.tensor(lengths), torch.zeros(B, dtype=torch.long), max(lengths)  # where d1 goes
            sampled = [b for b, s in enumerate(seqs) if not s.params.greedy]
            # rows whose processing reads their tokens: a copy of the history each, fed the drafts
            drafting = {b: s.history.copy() for b, s in enumerate(seqs) if s.history is not None}
            keep, vocab = self.draft_vocab, self.config.vocab_size
            for i in range(k):
                logits = self.draft.logits([rows])[0]  # [B, V] (pruned: [B, len(keep)])
                best = logits.argmax(dim=-1).to(drafts.device)  # the greedy rows' drafts (one op)
                drafts[:, i] = best if keep is None else keep[best]
                if keep is not None and (drafting or sampled):  # their processing reads the whole vocabulary
                    logits = expand(logits, keep, vocab)
                rows_of = {b: h.apply(logits[b].float().clone()) for b, h in drafting.items()}
                for b in rows_of:
                    if seqs[b].params.greedy:
                        drafts[b, i] = int(rows_of[b].argmax())
                for b in sampled:
                    probs = warp(rows_of.get(b, logits[b]), seqs[b].params)
                    q[b].append(probs)
                    drafts[b, i] = torch.multinomial(probs, 1, generator=seqs[b].gen)[0]
                for b, h in drafting.items():
                    h.append([int(drafts[b, i])])
                if i + 1 < k:
                    rows = Rows(drafts[:, i:i + 1], (pos + i)[:, None], slots, last, top + i + 1)
            if _graphs() == graphs:  # a step that compiled a graph says nothing of its cost
                self._t_draft = _smooth(self._t_draft, (time.perf_counter() - t0) / k)
        # 2. verify: [last, d1 .. dk] at the sequence's next k + 1 positions.
        t0, graphs = time.perf_counter(), _graphs()
        last = torch.tensor([[s.output[-1]] for s in seqs])
        base = torch.tensor([s.length - 1 for s in seqs])
        rows = Rows(torch.cat([last, drafts], dim=1), base[:, None] + torch.arange(k + 1), slots,
                    torch.full((B,), k), int(base.max()) + k + 1)
        logits = self.target.all_logits(rows)  # [B, k + 1, V]
        if _graphs() != graphs:
            pass  # compiled a graph: not a measure of the step's cost
        elif k:
            self._t_verify = _smooth(self._t_verify, time.perf_counter() - t0)
        else:
            self._t_plain = _smooth(self._t_plain, time.perf_counter() - t0)
        # 3. accept, per row.
        out = []
        for b, s in enumerate(seqs):
            target = logits[b] if s.history is None else processed_positions(s.history, logits[b],
                                                                              drafts[b].tolist())
            if s.params.greedy:
                a, nxt = accept_greedy(drafts[b], target)
            else:
                qb = torch.stack(q[b]) if q[b] else target.new_zeros(0, target.shape[-1])
                a, nxt = accept_sampled(drafts[b], qb, warp(target, s.params), s.gen)
            new = drafts[b, :a].tolist() + [nxt]
            # the target's raw logits at position j predicted new[j]
            lps = token_logprobs(logits[b, :len(new)], new, [s.params.logprobs] * len(new))
            if k == 0:  # nothing drafted: the draft has still to see what it had not
                s.pending = s.pending + [nxt]
            else:
                s.pending = [int(drafts[b, k - 1]), nxt] if a == k else [nxt]
            # The target has fed all but the last (and rejected drafts past it); the draft, all but ``pending``.
            s.valid = s.length + len(new) - 1
            s.draft_valid = s.length + len(new) - len(s.pending)
            out.append(self._emit(s, new, drafted=k, accepted=a, logprobs=lps))
        return out

    def _emit(self, seq: _Seq, new: list[int], *, drafted: int, accepted: int, first: bool = False,
              cached: int | None = None, logprobs: list | None = None) -> StepOutput:
        p, reason, kept = seq.params, None, []
        for t in new:
            kept.append(t)
            if t in p.stop_token_ids or (not p.ignore_eos and t in self.config.eos_token_ids):
                reason = "stop"
                break
            if len(seq.output) + len(kept) >= p.max_tokens:
                reason = "length"
                break
        seq.output += kept
        if seq.history is not None:
            seq.history.append(kept)
        if first:
            seq.pending = [kept[0]]
        else:
            seq.stats.add(drafted, accepted, len(kept))
            self.stats.add(drafted, accepted, len(kept))
        if reason is not None:
            self._running.pop(seq.request_id, None)
            self._release(seq)
            self.finished_stats[seq.request_id] = seq.stats
        lps = None if seq.params.logprobs is None or logprobs is None else logprobs[:len(kept)]
        return StepOutput(seq.request_id, kept, reason is not None, reason, cached, lps)

    def warm_up(self, max_passes: int = 3) -> None:
        """Compile every shape this engine can meet, now (with ``compile``): each model's forward over
        the row counts and widths of its steps (the draft: prefills and its pending 1-2 tokens, then
        single tokens; the target: prefills and verifies of 1 .. k + 1 tokens) at every attention span,
        then requests end to end (``sharding.stage.warm_up``). A shape's graph depends on the order
        shapes first arrived in, so the sweep repeats until a pass compiles nothing. Only on an idle
        engine (it overwrites cache slots); it leaves the engine as it found it."""
        from torch._dynamo.utils import counters

        from .stage import warm_up

        if self.has_work:
            raise RuntimeError("warm_up() needs an idle engine")
        n = self.slots.num_slots
        rows = sorted({min(b, n) for b in (1, 2, 3, n)})
        k_top = self.k_start
        prefill = [3, 5, 9, 17]
        for _ in range(max_passes):
            graphs = counters["stats"]["unique_graphs"]
            self.draft.sweep(rows, sorted({1, 2, *prefill}))
            self.target.sweep(rows, sorted({*range(1, k_top + 2), *prefill}))
            warm_up(self, max_passes=1)
            if counters["stats"]["unique_graphs"] == graphs:
                break
        if self.prefix is not None:  # the warm-up's prompts are nobody's history
            while self.prefix:
                self.slots.free(self.prefix.evict())
            self._draft_held.clear()
            self.prefix.hits = self.prefix.reused_tokens = 0
        self.stats, self.k, self._t_draft, self._t_verify, self._t_plain = SpecStats(), self.k_start, None, None, None
        self._plain_rounds = 0

    # -- offline -----------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[list[int]]:
        """Generate for every prompt and return the new tokens of each (on an idle engine)."""
        if self.has_work:
            raise RuntimeError("generate() needs an idle engine; drive add()/step() instead")
        ids = [f"generate-{id(self)}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params_per_prompt(prompts, params), strict=True):
            self.add(rid, prompt, p)
        out: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_work:
            for o in self.step():
                out[o.request_id] += o.token_ids
        return [out[rid] for rid in ids]


def _graphs() -> int:
    """Graphs torch.compile has made in this process so far (a timed step that made one compiled)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _smooth(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def _fit(model: Llama, num_slots: int, kv_cache_bytes: int | None) -> int:
    """The default ``max_len`` of ``model``'s cache (``sharding.kv_cache.fit_max_len``)."""
    return fit_max_len(model.config, num_slots=num_slots, layers=len(model.model.layers),
                       kv_heads=model.config.num_kv_heads, dtype=next(model.parameters()).dtype,
                       kv_cache_bytes=kv_cache_bytes)
