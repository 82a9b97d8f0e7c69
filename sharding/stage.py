"""``StageRunner``: one model's share of an engine step, the same code in process and on a chip.

A runner owns a model (whole, a pipeline stage, and/or a tensor-parallel rank), its ``KVCache``
and, on the stage with the head, the sampling generators (and ``History``s) of the requests it
samples, keyed by KV-cache slot. ``LocalExecutor`` drives one runner over the whole model; every chip of a ring
(``sharding.ring``) drives one over its shard.
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Sequence

import torch

from .batch import Rows, StepBatch
from .cached_attention import use_cached_attention
from .draft_vocab import PromptRows, checked_ids, expand, prune_head
from .errors import InvalidLayout
from .kv_cache import KVCache
from .model import Llama
from .packed import apply_packed_weights
from .sampling import History, Logprobs, SamplingParams, generator_for_seed, sample, token_logprobs


SPAN_BUCKET = 64
"""Attention reads the cache in multiples of this many positions (see ``span_for``)."""


def span_for(context: int, max_len: int) -> int:
    """Cache positions a step attends over: ``context`` rounded up to a multiple of ``SPAN_BUCKET``.

    Rounding bounds the distinct shapes a compiled model sees (``max_len / SPAN_BUCKET``) at the
    price of reading at most ``SPAN_BUCKET - 1`` masked positions.
    """
    return min(-(-context // SPAN_BUCKET) * SPAN_BUCKET, max_len)


def sweep_spans(max_len: int) -> list[int]:
    """The attention spans a warm-up visits so that every span a cache of ``max_len`` positions
    can meet runs on a graph compiled by then: the first three buckets (Dynamo turns the span
    symbolic once it changes, and a graph compiled after that guards against the sizes seen
    special before it) and the last one (``max_len`` itself). Any span between them passes the
    same guards: a multiple of ``SPAN_BUCKET`` wider than every step and below the cache's spare
    bucket. Visiting every bucket instead runs ``max_len / SPAN_BUCKET`` times the forwards (64 on
    a 4,096-token context, the widest spans the dearest) and compiles nothing more."""
    buckets = range(SPAN_BUCKET, max_len + SPAN_BUCKET, SPAN_BUCKET)
    return sorted({min(b, max_len) for b in (*buckets[:3], buckets[-1])})


class StageRunner:
    """Runs a step's row groups through ``model`` and, with the head, samples their tokens.

    Args:
        model: a loaded ``Llama`` (or stage, or TP rank).
        num_slots, max_len, kv_cache_bytes: of the ``KVCache`` built for it (``KVCache.for_model``).
        compile: run the model's forward through ``torch.compile`` (see ``compile_forward``);
            the first steps of each new shape compile (seconds), later ones run the compiled code.
        compile_regions: with ``compile``, compile one decoder layer and reuse it for every layer
            (``compile_forward``'s ``regions``): a deep model's graphs compile many times faster,
            and its steps run a little slower.
        packed_weights: fastmode's CPU kernels: small steps read their weights as bfloat16
            (``sharding.packed``; lossless for bfloat16 checkpoints) and attention reads the cache in
            place (``sharding.cached_attention``). Raises ``PackedWeightsUnavailable`` where they cannot run.
        vocab: (the stage with the head) the only token ids it may produce, ascending
            (``sharding.draft_vocab.keep_ids``; ``InvalidLayout`` otherwise): its head keeps their
            rows alone, so each step multiplies by ``len(vocab)`` rows instead of the vocabulary's;
            ``logits`` gives ``-inf`` to every other id, so nothing samples them. ``None``: the
            whole vocabulary. Needs the whole head on this runner (no tensor parallelism).
        keep_prompt: with ``vocab``, each request may also produce its own prompt's tokens: their
            rows of the whole head join the kept ones for that request alone
            (``sharding.draft_vocab.PromptRows``; the prompts come with ``admit``'s batch).
    """

    def __init__(self, model: Llama, *, num_slots: int, max_len: int | None = None,
                 compile: bool = False, compile_regions: bool = False, packed_weights: bool = False,
                 kv_cache_bytes: int | None = None, vocab: Sequence[int] | None = None,
                 keep_prompt: bool = False) -> None:
        self.vocab: torch.Tensor | None = None
        """The ids the head keeps (``vocab``), or ``None``: the whole vocabulary."""
        self.prompt_rows: PromptRows | None = None
        """With ``keep_prompt``: each request's prompt tokens outside ``vocab``, and their head rows."""
        if vocab is not None and model.has_head:
            vocab = checked_ids(vocab, model.config.vocab_size)
            if keep_prompt:
                self.prompt_rows = PromptRows(model.lm_head.weight, vocab, model.config.final_logit_softcapping)
            prune_head(model, vocab)  # before packing and compiling: both see the cut head
            self.vocab = vocab.to(next(model.parameters()).device)
        self.packed_linears = apply_packed_weights(model) if packed_weights else 0
        """How many of the model's linears run from packed bfloat16 weights (0: packing off)."""
        self.cached_attention_layers = use_cached_attention(model) if packed_weights else 0
        """How many of the model's attention layers read the cache in place (0: the kernels are off)."""
        # (before compile: the graphs capture the packed kernel)
        self.model = model
        # One spare bucket: no span equals the cache's length, so the last bucket needs no graphs of its own.
        self.cache = KVCache.for_model(model, num_slots=num_slots, max_len=max_len, kv_cache_bytes=kv_cache_bytes,
                                       spare=SPAN_BUCKET)
        self.device = next(model.parameters()).device
        self.params: dict[int, SamplingParams] = {}
        """Slot -> sampling parameters of the request in it (on the stage with the head)."""
        self.generators: dict[int, torch.Generator] = {}
        self.histories: dict[int, History] = {}
        """Slot -> the token history of a request whose sampling looks at one (``SamplingParams.uses_history``)."""
        self._forward = compile_forward(model, regions=compile_regions) if compile else model
        # With prompt rows the decode graph also answers the normed hidden states they multiply.
        decode = model.decode_hidden_logits if self.prompt_rows else model.decode_logits
        self._decode = decode if model.has_head else None
        if compile and model.has_head:
            self._decode = compile_method(decode, cpp_wrapper=cpp_wrapper(model, compile_regions))

    def _args(self, r: Rows, x: torch.Tensor) -> tuple:
        """The model's arguments for part ``r`` with input ``x`` (tokens, or the previous stage's
        hidden states), each in storage of its own on this runner's device."""
        dev = self.device
        # A part whose longest row ends at its width starts every row at position 0 (fresh prompts):
        # SDPA's causal path, no mask (Llama.forward's ``causal``).
        return (_own_storage(x, dev), _own_storage(r.positions, dev), _own_storage(r.slots, dev), self.cache,
                *((r.context, True) if _fresh(r) else (span_for(r.context, self.cache.max_len),)))

    def forward(self, parts: list[Rows], inputs: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Hidden states ``[B, S, D]`` per part; ``inputs`` are the previous stage's, else the tokens.

        On the stage with the head, a part of one token per row goes through ``logits`` or ``feed``
        instead: their decode graph is the only one ``sweep`` compiles for that width there."""
        xs = inputs if inputs is not None else [r.tokens for r in parts]
        return [self._forward(*self._args(r, x)) for r, x in zip(parts, xs, strict=True)]

    def feed(self, parts: list[Rows]) -> None:
        """Run the parts' tokens into the cache; their outputs are not needed (a draft's prefill)."""
        for r in parts:
            if self.model.has_head and r.positions.shape[1] == 1:
                self.logits([r])
            else:
                self.forward([r])

    def logits(self, parts: list[Rows], inputs: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Forward (as ``forward``) and the head: logits ``[B, V]`` at each row's last real token, per
        part (the stage with the head). A decode part (one token per row) runs both as one call
        (``Llama.decode_logits``): under ``compile`` one graph entered per step.

        Under tensor parallelism every rank must call this (the head all-gathers).
        """
        xs = inputs if inputs is not None else [r.tokens for r in parts]
        out = []
        for r, x in zip(parts, xs, strict=True):
            if r.positions.shape[1] == 1:
                if self.prompt_rows:
                    logits, h = self._decode(*self._args(r, x))
                    out.append(self._whole(logits, h, r.slots.tolist()))  # [B, V]
                else:
                    out.append(self._whole(self._decode(*self._args(r, x))))  # [B, V]
                continue
            h = self._forward(*self._args(r, x))
            rows = torch.arange(r.num_rows, device=self.device)
            h = h[rows, r.last.to(self.device)]
            out.append(self._whole(self.model.compute_logits(h), h, r.slots.tolist()))  # [B, V]
        return out

    def _whole(self, logits: torch.Tensor, hidden: torch.Tensor | None = None,
               slots: Sequence[int] = ()) -> torch.Tensor:
        """The head's logits over the whole vocabulary (a cut head's: ``-inf`` outside ``vocab``, and
        outside each row's prompt tokens with ``keep_prompt``: ``hidden`` the normed hidden states
        the head read, ``slots`` each row's slot)."""
        if self.vocab is None:
            return logits
        full = expand(logits, self.vocab, self.model.config.vocab_size)
        return full if self.prompt_rows is None or hidden is None else self.prompt_rows.fill(full, hidden, slots)

    def all_logits(self, r: Rows) -> torch.Tensor:
        """Logits ``[B, S, V]`` at every position of part ``r`` (the stage with the head; a
        speculative verify). A part of one token per row runs as ``logits`` runs it: one call."""
        if r.positions.shape[1] == 1:
            return self.logits([r])[0][:, None]
        h = self.forward([r])[0]
        return self._whole(self.model.compute_logits(h), h, r.slots.tolist())

    @torch.inference_mode()
    def sweep(self, rows: list[int], widths: list[int]) -> None:
        """Run ``rows x widths`` inputs (dummy tokens in the first slots) at the attention spans that
        compile something (``sweep_spans``; with the head, one-token inputs as ``logits`` runs them),
        so that compiling happens now. Only before serving: it overwrites those slots' caches. (The
        shapes an engine meets, enumerated, where running requests would reach some only by chance:
        ``SpeculativeEngine.warm_up``.)"""
        for span in sweep_spans(self.cache.max_len):
            for B in rows:
                for S in widths:
                    if S > span:
                        continue
                    r = Rows(torch.ones(B, S, dtype=torch.long), (span - S + torch.arange(S)).repeat(B, 1),
                             torch.arange(B), torch.full((B,), S - 1), span)
                    self.feed([r])

    def admit(self, batch: StepBatch) -> None:
        """Forget the parameters of freed slots; keep those of newly admitted requests (and make
        a sampled request's generator, seeded once, so its draws are the same alone or batched, and
        the ``History`` of one whose processing looks at its tokens)."""
        for slot in batch.freed:
            self.params.pop(slot, None)
            self.generators.pop(slot, None)
            self.histories.pop(slot, None)
            if self.prompt_rows:
                self.prompt_rows.free(slot)
        for slot, p in batch.admit.items():
            self.params[slot] = p
            if self.prompt_rows:
                self.prompt_rows.admit(slot, batch.prompts.get(slot, ()))
            if not p.greedy:
                self.generators[slot] = generator_for_seed(p.seed, self.device)
            self.histories.pop(slot, None)
            if p.uses_history:
                config = self.model.config
                self.histories[slot] = History(p, batch.prompts.get(slot, ()), config.vocab_size,
                                               config.eos_token_ids, self.device)

    def sample(self, parts: list[Rows], logits: list[torch.Tensor]) -> tuple[list[list[int]], dict[int, Logprobs]]:
        """One token per row of each part (call ``admit`` for the step first), and the ``Logprobs`` of
        each row whose request asked for them, by slot."""
        out, logprobs = [], {}
        for r, lg in zip(parts, logits, strict=True):
            slots = r.slots.tolist()
            params = [self.params[s] for s in slots]
            histories = [self.histories.get(s) for s in slots] if self.histories else None
            if all(p.greedy for p in params) and not (histories and any(histories)):
                tokens = lg.argmax(dim=-1).tolist()
            else:
                gens = [None if p.greedy else self.generators[s] for p, s in zip(params, slots, strict=True)]
                tokens = sample(lg, params, gens, histories).tolist()
                for h, t in zip(histories or (), tokens):
                    if h is not None:
                        h.append([t])
            if any(p.logprobs is not None for p in params):
                for s, lp in zip(slots, token_logprobs(lg, tokens, [p.logprobs for p in params]), strict=True):
                    if lp is not None:
                        logprobs[s] = lp
            out.append(tokens)
        return out, logprobs

    def prompt_logits(self, prompt: torch.Tensor | None, slot: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Debug: one prompt through this model in ``slot``: hidden states ``[1, S, D]``, or on the
        stage with the head the logits of every position ``[S, V]`` (every TP rank must call it).

        ``prompt``: ``[S]`` token ids on the first stage; ``hidden``: the previous stage's output.
        """
        S = int(prompt.shape[0]) if prompt is not None else int(hidden.shape[1])
        rows = Rows(prompt[None] if prompt is not None else None, torch.arange(S)[None],
                    torch.tensor([slot]), torch.tensor([S - 1]), S)
        h = self.model(hidden if prompt is None else rows.tokens.to(self.device), rows.positions.to(self.device),
                       rows.slots.to(self.device), self.cache, span_for(S, self.cache.max_len))
        if not self.model.has_head:
            return h
        if self.prompt_rows and prompt is not None:
            self.prompt_rows.admit(slot, prompt.tolist())
        return self._whole(self.model.compute_logits(h)[0], h[0], [slot] * S)


def warm_up(model, max_passes: int = 3) -> None:
    """Run the shapes a served engine meets (``model``: anything with ``generate`` and ``max_len``,
    e.g. ``ShardedModel``, ``Engine``, ``SpeculativeEngine``) so that compiling happens now, not on a user's request.

    Dynamo first specialises on the shapes it sees, then makes a dimension dynamic once it
    changes (``compile_forward``); size 1 stays special. So: one-row decodes across three
    attention-span buckets (the span turns symbolic), one-row prefills of two lengths, then two- and
    three-row prefills and decodes, then prompts that continue earlier ones by several tokens (a
    prefix cache's masked prefills; fresh prompts take SDPA's causal path, ``Llama.forward``). The
    cache keeps a spare bucket past ``max_len`` (``StageRunner``), so no span ever equals its length
    and the end of the context needs no graphs of its own: nothing here decodes or prefills near it,
    which on a real model's 4,096-token context would cost minutes. Every input reaches the model
    with its own storage (``_own_storage``), so no later batch size or message layout meets a guard
    these did not.

    Which graphs a shape ends up on depends on the order shapes arrive in (a graph compiled once a
    size turned symbolic guards against the values seen special before it), so the sequence runs
    again until a pass compiles nothing (at most ``max_passes``).
    """
    from torch._dynamo.utils import counters

    greedy = lambda n: SamplingParams(temperature=0, max_tokens=max(1, min(n, model.max_len - 16)), ignore_eos=True)  # noqa: E731
    for _ in range(max_passes):
        graphs = counters["stats"]["unique_graphs"]
        # Three span buckets crossed turn the span symbolic; decoding to the end of a long context
        # (thousands of steps on a real model) would compile nothing more.
        model.generate([[1, 2, 3]], greedy(3 * SPAN_BUCKET + SPAN_BUCKET // 2))
        model.generate([[1, 2, 3, 4, 5]], greedy(4))
        model.generate([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5]], greedy(8))
        model.generate([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8, 9]],
                       SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, seed=0))
        # Prompts continuing a cached prefix by several tokens (a conversation's next turn, with a
        # prefix cache): masked prefills, one and two rows; fresh prompts take the causal path.
        starts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
        outs = model.generate(starts, greedy(4))
        model.generate([starts[0] + outs[0] + [7, 8, 9]], greedy(4))
        model.generate([p + o + [10, 11, 12, 13][: 2 + i] for i, (p, o) in enumerate(zip(starts, outs))], greedy(4))
        if counters["stats"]["unique_graphs"] == graphs:
            return


def _fresh(rows: Rows) -> bool:
    """Whether every row of a prefill is a prompt from position 0 (no cached prefix).

    A step as wide as its context is not enough: a fresh prompt at least as long as a continuing
    one (a prefix-cache hit, starting past 0) makes one so, and SDPA's causal path would then let
    the continuing row's queries see only as many keys as their index in the step."""
    width = rows.positions.shape[1]
    return width > 1 and rows.context == width and not bool(rows.positions[:, 0].any())


def _own_storage(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, in storage of its own, made the same way every step (one copy: the move
    to another device is the copy).

    The step's inputs arrive as views: rows of one ``[4, B]`` tensor (``scheduler.decode_rows``),
    slices of a received message (``sharding.transport``). Dynamo guards on a view's storage offset,
    which then follows the batch size or the message layout: once it has seen two offsets it makes
    the offset symbolic with a guard (``2 <= positions.storage_offset()``), and a later step whose
    offset is 0 or 1 compiled a new graph on a user's request (a 780 ms first token at 4 streams
    on a fresh app, after a warm-up that had run 4 rows). It also guards on the dispatch keys, which
    differ between a tensor made inside ``inference_mode`` and one made outside: so every input is
    copied, views or not (a few hundred bytes a step; a pipeline stage's hidden states, ``B x S x D``).
    The copy has contiguous strides: a plain ``clone`` keeps a view's, and a column of the
    speculative engine's ``[B, k]`` drafts has a stride that follows ``k``, another guard.
    """
    moved = t.to(device, memory_format=torch.contiguous_format)
    return moved if moved is not t else t.clone(memory_format=torch.contiguous_format)


def compile_forward(model: Llama, *, regions: bool = False):
    """``model``'s forward under ``torch.compile``, set up for small-batch decoding.

    - Shapes start static and become dynamic only where they change (``dynamic=None``): the
      first steps specialise, then batch size, prompt length and attention span each turn
      symbolic once seen to vary, so a long-running engine settles on a few graphs (a prefill
      and a decode one) instead of recompiling per shape. Fully dynamic graphs run slower.
    - ``cpp_wrapper``: the graph's launcher is C++ rather than Python. A decode step is dozens
      of tiny kernels, so the launcher, not the arithmetic, is most of its time on CPU.

    - Not with tensor parallelism: inductor's C++ wrapper cannot call the explicit collectives
      (``InductorError: arg type Any is not yet supported by custom_op_wrapper``, torch 2.13), so a
      TP rank keeps the Python launcher.

    One engine settles on about seven graphs (prefill and decode, static then dynamic); the exact
    engine's target and draft more each (verify widths, prefix-cache prefills). Dynamo counts them
    per code object against ``torch._dynamo.config.recompile_limit`` and, past it, runs that model
    eager (correct, slower): ``compile_method`` raises the limit to ``RECOMPILE_LIMIT``.

    ``regions``: each decoder layer is a nested compile region (``torch.compiler.nested_compile_region``,
    ``mark_layer_regions``): Dynamo traces the first layer and stamps its graph out for the others
    (checking what the first trace read of its layer against each layer's own: where that differs,
    e.g. a sliding window the cached-attention kernel reads, or an argument that is ``None`` there,
    the layer gets a trace of its own), and inductor compiles that one layer, so a graph's compile
    no longer grows with the model's depth. Inductor's C++ launcher cannot call a region (``codegen invoke_subgraph is not
    implemented for cpp wrapper``, torch 2.13), so the Python one runs, and every layer is a call: a
    much shorter warm-up for a slower step (measured in
    ``docs/decisions/035-the-exact-lane-compiles-one-layer.md``).
    """
    if regions:
        mark_layer_regions(model)
    return compile_method(model.forward, cpp_wrapper=cpp_wrapper(model, regions))


def mark_layer_regions(model: Llama) -> None:
    """Make each of ``model``'s decoder layers a nested compile region (``compile_forward``'s
    ``regions``; eager calls are unchanged). Not under tensor parallelism (``InvalidLayout``): a
    region's collectives are untested.

    The layer's class becomes a subclass whose ``forward`` is the region, as a decorated method
    would be: a region bound to each layer as an instance attribute (``MethodType``) is stamped out
    with the first layer's weights for every layer (torch 2.13: the source of ``self`` is not the
    one Dynamo replaces), and silently computes the wrong thing."""
    if is_tensor_parallel(model):
        raise InvalidLayout("compile regions are for a model on one chip, not a tensor-parallel rank")
    for layer in model.model.layers.values():
        layer.__class__ = _region_class(type(layer))


@functools.cache
def _region_class(cls: type) -> type:
    """``cls`` with its ``forward`` a nested compile region (``mark_layer_regions``)."""
    if getattr(cls, "_compile_region", False):
        return cls
    return type(f"{cls.__name__}Region", (cls,), {"forward": torch.compiler.nested_compile_region(cls.forward),
                                                  "_compile_region": True, "__module__": cls.__module__})


def cpp_wrapper(model: torch.nn.Module, regions: bool) -> bool:
    """Whether ``model``'s graphs get inductor's C++ launcher: not with compile regions, not under
    tensor parallelism (``compile_forward``)."""
    return not regions and not is_tensor_parallel(model)


_code_objects = itertools.count()
RECOMPILE_LIMIT = 32
"""Graphs one compiled model may have before Dynamo runs it eager (its default is 8: the exact
engine's models need more, and passing it silently leaves shapes uncompiled)."""
BACKEND = "inductor"
"""``torch.compile``'s backend for every model (tests set ``"eager"`` to check Dynamo's side quickly)."""


def compile_method(method, *, cpp_wrapper: bool):
    """``method`` (a bound method of a model) under ``torch.compile``, with a code object of its own
    and without guards on the model's modules.

    Dynamo keeps compiled graphs per code object, and checks a call's guards against them: with the
    code shared by every ``Llama``, a draft and its target (or two engines in one process) shared
    one list of graphs, one recompile budget, and guards on each module's structure and parameters
    to tell them apart (about 8,000 guards a call on a 30-layer model, evaluated every step). Here
    each model's method gets a copy of the code (``own_code``), so its graphs are its own, and its
    guards skip the model's modules (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``; a few
    hundred remain, on the inputs). That is sound because nothing changes a model's modules once it
    is compiled: packing (``sharding.packed``), a pruned draft head (``sharding.draft_vocab``) and
    tensor-parallel splitting (``sharding.tp``) all happen before, and a rebuilt chip builds a new
    model. ``tests/sharding/test_speculative.py`` checks that a draft and its target, compiled in one
    process, each keep their own output.
    """
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    if BACKEND == "inductor":
        options["cpp_wrapper"] = cpp_wrapper
    return torch.compile(own_code(method), backend=BACKEND, dynamic=None, options=options)


def own_code(method):
    """``method`` (bound) as a new function over a copy of its code object (renamed ``NAME_N``), so
    that Dynamo's per-code caches are this object's alone."""
    f, n = method.__func__, next(_code_objects)
    name = f"{f.__name__}_{n}"
    code = f.__code__.replace(co_name=name, co_qualname=f"{f.__qualname__}_{n}")
    g = types.FunctionType(code, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    return types.MethodType(g, method.__self__)


def is_tensor_parallel(model: torch.nn.Module) -> bool:
    """Whether any of ``model``'s layers is split over more than one rank."""
    return any(getattr(m, "tp_size", 1) > 1 for m in model.modules())
