"""``ShardedModel``: tp x pp rings of Ray chip actors against transformers; hops; placement errors.

Every generation here runs the ring (``sharding.ring``): the chips decode by themselves and the
test reads their outputs. One Ray session for the module (four chips, two CPUs). ``pipe`` is
parametrized indirectly with ``(tp, pp, checkpoint, compile)`` and module-scoped, so pytest groups
the tests by layout and builds each one once; only one layout is alive at a time (they share the
four chips).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import pytest
import ray
import torch

from sharding import packed
from sharding.errors import EmptyPrompt, InvalidLayout, NotEnoughChips, PromptTooLong, TokenOutOfRange
from sharding.pipeline import ChipUnresponsive, RingFailed, ShardedModel
from sharding.sampling import SamplingParams
from sharding.transport import Link

from .conftest import SHIPPED, hf_greedy, hf_logits, hf_processing, prompt_ids, resolve, save_random_llama
from .test_engine import processing_cases

CHIPS = 4
TOL = 1e-4
LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]
EAGER = False
# Every layout, on the tiny full model but for 2 x 2, which runs the shipped test full model (the same
# kind: untied, GQA): a four-chip ring is the dearest to start (about 25 s on 2 cores), so make test
# starts two (this one and the tied model's), not three.
TINY = [(tp, pp, "tiny-full", EAGER) for tp, pp in LAYOUTS if (tp, pp) != (2, 2)] + [(2, 2, "full", EAGER)]
PIPELINED = [(1, 2, "tiny-full", EAGER), (2, 2, "full", EAGER)]
PACKS = packed.unavailable_reason() is None
# torch.compile inside the chips, as the fast lane runs them (pp=2 with packed bfloat16 weights,
# sharding.packed, where the kernel runs; tp=2 with its collectives on float32 weights).
COMPILED = [(1, 2, "fast", True, PACKS), (2, 1, "tiny-full", True)]
PARITY = list(dict.fromkeys(TINY + [(2, 2, "tiny-full", EAGER), (2, 2, "random-tied", EAGER)]
                            + [(tp, pp, name, EAGER) for name in SHIPPED for tp, pp in LAYOUTS]))
# Packed weights in tensor-parallel linears; the shipped checkpoints are bfloat16 values, so the
# greedy tokens stay transformers' own.
PACKED = [(2, 2, "full", EAGER, True)] if PACKS else []


def _id(p: tuple) -> str:
    tp, pp, name, compile_, *packed_ = p
    return f"tp{tp}-pp{pp}-{name}" + ("-compiled" if compile_ else "") + ("-packed" if any(packed_) else "")


def _full(p: tuple) -> bool:
    """In the full suite only (``make test-all``): a compiled ring (a cold compile in its chips, minutes),
    packed weights in a ring (``test_packed`` runs them in process), the shipped checkpoints but the
    full model at tp=2 x pp=2, and the tiny full model at 2 x 2 (``TINY`` covers every layout in
    ``make test``)."""
    tp, pp, name, compile_, *packed_ = p
    return (compile_ or any(packed_) or (name in SHIPPED and (tp, pp, name) != (2, 2, "full"))
            or (tp, pp, name) == (2, 2, "tiny-full"))


def _pipe(params: list[tuple]):
    return pytest.mark.parametrize("pipe", [pytest.param(p, marks=[pytest.mark.full] if _full(p) else []) for p in params],
                                   indirect=True, ids=_id)


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", resources={"chip": CHIPS}, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pipe(request, ray_cluster, tiny_dir):
    """``(model, checkpoint path)`` for one layout, built once for every test that asks for it."""
    tp, pp, name, compile_, *packed_ = request.param
    path = resolve(name, tiny_dir)
    model = ShardedModel.from_pretrained(path, tp=tp, pp=pp, num_slots=4, compile=compile_,
                                         packed_weights=any(packed_))
    yield model, path
    model.shutdown()


def free_chips() -> float:
    return ray.available_resources().get("chip", 0)


def live_groups() -> int:
    return sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values())


def wait_for_chips(n: float, timeout_s: float = 20) -> float:
    """Free chips once they reach ``n`` (killed actors give theirs back asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while free_chips() < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return free_chips()


@_pipe(PARITY)
def test_prompt_logits_match_transformers(pipe):
    model, path = pipe
    ids = prompt_ids(path, 24)
    assert (model.prompt_logits(ids) - hf_logits(path, ids)).abs().max().item() <= TOL


@_pipe(PARITY + COMPILED + PACKED)
def test_greedy_64_tokens_match_transformers(pipe):
    model, path = pipe
    ids = prompt_ids(path, 24)
    assert model.generate([ids], SamplingParams(temperature=0, max_tokens=64))[0] == hf_greedy(path, ids, 64)


@_pipe(TINY)
def test_batch_and_seeded_samples_match_alone(pipe):
    model, path = pipe
    prompts = [prompt_ids(path, n, seed=n) for n in (5, 17, 11, 30)]
    params = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=20),
              SamplingParams(temperature=0, max_tokens=9), SamplingParams(temperature=0.5, seed=3, max_tokens=20)]
    alone = [model.generate([p], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    assert model.generate(prompts, params) == alone
    assert len(set(map(tuple, alone))) > 1


@_pipe(TINY)
def test_processed_greedy_matches_transformers_and_sampling_matches_alone(pipe):
    """The ring's last stage processes the logits with each request's history (its prompt sent once,
    with its parameters): greedy ``repetition_penalty``, ``logit_bias`` and ``min_tokens`` give
    transformers' ``generate``; a penalised, top-k, min-p sampled request repeats alone and batched."""
    model, path = pipe
    ids = prompt_ids(path, 9, seed=4)
    n = 16
    free = model.generate([ids], SamplingParams(temperature=0, max_tokens=n))[0]
    cases = processing_cases(free, n)[:3]
    want = [hf_greedy(path, ids, n, **hf_processing(p, model.config.eos_token_ids)) for p in cases]
    sampled = SamplingParams(temperature=0.8, top_k=8, min_p=0.05, presence_penalty=1.0, frequency_penalty=0.5,
                             repetition_penalty=1.2, seed=3, max_tokens=n)
    alone = model.generate([ids], sampled)[0]
    assert model.generate([ids] * 4, cases + [sampled]) == want + [alone]


@_pipe(TINY)
def test_logprobs_come_back_from_the_last_stage_as_transformers_has_them(pipe):
    from .test_engine import assert_logprobs_are_transformers

    model, path = pipe
    ids = prompt_ids(path, 9, seed=4)
    model.add("lp", ids, SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True))
    tokens, lps = [], []
    while model.has_work:
        for o in model.step():
            tokens += o.token_ids
            lps += o.logprobs
    assert_logprobs_are_transformers(path, ids, tokens, lps, 3)


@_pipe(TINY)
def test_sequence_joining_mid_batch_matches_alone(pipe):
    model, path = pipe
    a, b, c = (prompt_ids(path, n, seed=10 + n) for n in (7, 19, 12))
    params = SamplingParams(temperature=0, max_tokens=16)
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    alone = {k: model.generate([p], sp)[0] for k, p, sp in zip("abc", (a, b, c), (long, params, params), strict=True)}
    model.add("a", a, long)
    model.add("b", b, SamplingParams(temperature=0, max_tokens=5))
    got: dict[str, list[int]] = {}
    while "b" in model._unfinished:  # b's end is sent at once, while a still runs
        for o in model.step():
            got.setdefault(o.request_id, []).extend(o.token_ids)
    assert got["b"] == alone["b"][:5] and len(got["a"]) < 60 and model.num_unfinished == 1
    model.add("c", c, params)  # joins the running batch
    while model.has_work:
        for o in model.step():
            got.setdefault(o.request_id, []).extend(o.token_ids)
    assert got["a"] == alone["a"] and got["c"] == alone["c"] and model.num_unfinished == 0


@_pipe(PIPELINED)
def test_every_step_reports_its_hops(pipe):
    model, path = pipe
    tp, d = model.tp, model.config.hidden_size
    model.add("x", prompt_ids(path, 5), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    model.add("y", prompt_ids(path, 9, seed=1), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    infos = []
    while model.has_work:
        model.step()
        infos += model.last_infos
    # Usually one prefill of two rows padded to 9, then three decodes of two rows; but the ring
    # decodes by itself, so "y" may arrive a step after "x" started (then [1, 2, 2, 2, 1]). Either
    # way: 2 requests x 4 tokens, and each step's hops carry its own rows.
    assert sum(i.batch_size for i in infos) == 8 and all(i.batch_size in (1, 2) for i in infos)
    for info in infos:
        b, hops = info.batch_size, info.hops
        between = [h for h in hops if (h.src_stage, h.dst_stage) == (0, 1)]
        assert len(between) == tp and {h.dst_chip for h in between} == {c.chip for c in model.layout[tp:]}
        s = between[0].bytes // (b * d * 4)  # the step's row length: 1 (decode) or a padded prompt
        assert s in (1, 5, 9), s
        assert all(h.bytes == b * s * d * 4 and h.transport == "tcp" for h in between)
        back = [h for h in hops if (h.src_stage, h.dst_stage) == (1, 0)]
        assert len(back) == tp and {h.dst_chip for h in back} == {model.layout[0].chip}
        assert sorted(h.bytes for h in back) == [0] * (tp - 1) + [8 * b]  # rank 0 carries the tokens
        fanout = [h for h in hops if (h.src_stage, h.dst_stage) == (0, 0)]  # token ids to the head's TP peers
        assert len(fanout) == tp - 1 and all(h.bytes == 8 * b * s for h in fanout)
        # wall clocks of two processes: a hop can read 0 (never negative), a step's hops not all 0
        assert len(hops) == 3 * tp - 1 and all(h.seconds >= 0 for h in hops) and sum(h.seconds for h in hops) > 0
        assert len(info.stage_seconds) == 2 and info.end_ns > info.start_ns


@_pipe([(2, 2, "tiny-full", EAGER)])
def test_layout_names_every_chip(pipe):
    model, _ = pipe
    assert [(c.index, c.stage, c.tp_rank, c.layers) for c in model.layout] == [
        (0, 0, 0, (0, 1)), (1, 0, 1, (0, 1)), (2, 1, 0, (1, 2)), (3, 1, 1, (1, 2))]
    assert all(c.chip.endswith(f"/chip{c.index}") for c in model.layout)
    assert [c.has_embedding for c in model.layout] == [True, True, False, False]


@_pipe([(1, 2, "tiny-full", EAGER)])
@pytest.mark.parametrize("prompt, params, error", [
    ([], None, EmptyPrompt),
    ([0, 5, 600], None, TokenOutOfRange),
    ([0] * 100, SamplingParams(temperature=0, max_tokens=29), PromptTooLong),  # context is 128
])
def test_bad_input_raises_typed_errors(pipe, prompt, params, error):
    model, _ = pipe
    with pytest.raises(error):
        model.add("bad", prompt, params)
    assert not model.has_work


@pytest.mark.parametrize("name, tp, pp, what", [
    ("tiny-full", 3, 1, "tensor parallel size 3"),
    ("tiny-full", 8, 1, "num_attention_heads=4"),
    ("tiny-full", 1, 3, "pipeline parallel size 3 exceeds num_hidden_layers=2"),
])
def test_layout_that_does_not_divide_raises(ray_cluster, tiny_dir, name, tp, pp, what):
    groups = live_groups()
    with pytest.raises(InvalidLayout, match=what) as info:
        ShardedModel.from_pretrained(resolve(name, tiny_dir), tp=tp, pp=pp)
    assert info.value.code == "invalid_layout" and live_groups() == groups


def test_more_chips_than_the_cluster_has(ray_cluster, tmp_path):
    path = save_random_llama(tmp_path / "six-layers", num_hidden_layers=6)
    groups, chips = live_groups(), free_chips()
    start = time.monotonic()
    with pytest.raises(NotEnoughChips, match="needs 6 chips.*has 4") as info:
        ShardedModel.from_pretrained(path, tp=2, pp=3)
    assert time.monotonic() - start < 10 and info.value.code == "not_enough_chips"
    assert live_groups() == groups and free_chips() == chips


@_pipe([(2, 2, "tiny-full", EAGER)])
def test_chips_held_by_others_time_out_and_leave_nothing(pipe, tiny_dir):
    """All four chips are held by ``pipe``: a second model waits, gives up, and cleans up."""
    groups = live_groups()
    with pytest.raises(NotEnoughChips, match="could not get 1 chips"):
        ShardedModel.from_pretrained(tiny_dir / "full", placement_timeout_s=1.0)
    assert live_groups() == groups and free_chips() == 0


@_pipe([(2, 1, "random-tied", EAGER)])
def test_shutdown_releases_every_chip(pipe):
    model, path = pipe  # the only layout alive now: the fixture holds one at a time
    ids = prompt_ids(path, 8)
    with model:
        assert wait_for_chips(CHIPS - 2) == CHIPS - 2  # the previous layout's chips came back
        assert model.generate([ids], SamplingParams(temperature=0, max_tokens=4))[0] == hf_greedy(path, ids, 4)
    assert wait_for_chips(CHIPS) == CHIPS and live_groups() == 0
    model.shutdown()  # idempotent
    with pytest.raises(RingFailed, match="shut down"):
        model.generate([ids])


def _client(model: ShardedModel, secret: bytes | None = None) -> Link:
    link = Link.connect(*model.client_address)
    link.sock.sendall(model.secret if secret is None else secret)
    link.sock.settimeout(60)
    link.spin_s = 0
    return link


def _read_until_done(link: Link, rid: str) -> tuple[list[int], set[str]]:
    """``rid``'s tokens from the head, and every request id that arrived on this link."""
    tokens, seen = [], set()
    while True:
        msg, _ = link.recv()
        assert msg[0] == "out", msg
        for out_rid, token, finished, *_ in msg[1]:
            seen.add(out_rid)
            if out_rid == rid:
                tokens.append(token)
                if finished:
                    return tokens, seen


@_pipe([(1, 2, "tiny-full", EAGER)])
def test_clients_stream_side_by_side_and_each_keeps_its_own(pipe):
    """The head takes several clients at once (the lane replica's and each front door's head link,
    ``serve.lanes.head_links``): each gets its own requests' tokens, transformers' greedy ones; one
    that goes away takes only its own requests; a connection without the secret is closed unread."""
    model, path = pipe
    ids, other_ids = prompt_ids(path, 6), prompt_ids(path, 9, seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = ray.get(model.head_worker.ring_load.remote())
    stranger = socket.create_connection(model.client_address, timeout=30)
    stranger.sendall(b"x" * len(model.secret))
    other, leaver = _client(model), _client(model)
    long = SamplingParams(temperature=0, max_tokens=model.max_len - len(ids), ignore_eos=True)
    leaver.send(("add", "left", ids, long))
    assert leaver.recv()[0][0] == "out"  # it is decoding
    model.add("mine", ids, greedy)
    other.send(("add", "theirs", other_ids, greedy))
    leaver.close()  # goes away mid-stream
    theirs, seen = _read_until_done(other, "theirs")
    mine = []
    while model.has_work:
        mine += [t for o in model.step() for t in o.token_ids]
    assert mine == hf_greedy(path, ids, 8)[:8]
    assert theirs == hf_greedy(path, other_ids, 8)[:8]
    assert seen == {"theirs"}  # nothing of another client's requests
    assert stranger.recv(1) == b""  # closed unread
    load = ray.get(model.head_worker.ring_load.remote())
    assert load["running"] == 0 and load["aborted"] == before["aborted"] + 1, load  # "left" only
    assert load["clients"] == 2  # the model's own and `other`
    other.close()
    stranger.close()


@_pipe([(1, 2, "tiny-full", EAGER)])
def test_a_head_client_sends_each_request_before_its_first_output_is_asked_for(pipe):
    """``HeadClient.generate`` (a front door's fast lane) sends the request to the head at once, so
    the front door's own work before it waits (``response.created``) overlaps the prefill: the head
    is running it before the stream is iterated, and its tokens are transformers' greedy ones. A
    stream closed before it was iterated frees its slot at the head; a bad request raises its typed
    error at the first output, as it did when nothing was sent before then."""
    from tokenizers import Tokenizer

    from serve.lanes.engine import EngineRequest
    from serve.lanes.head_client import HeadClient
    from sharding.config import ModelConfig

    model, path = pipe
    ids = prompt_ids(path, 6)
    n = min(200, model.max_len - len(ids))

    def ring_load() -> dict[str, int]:
        return ray.get(model.head_worker.ring_load.remote())

    def until(what, timeout_s: float = 30) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while not what(load := ring_load()) and time.monotonic() < deadline:
            time.sleep(0.02)
        return load

    async def run() -> list[int]:
        client = HeadClient(ModelConfig.from_pretrained(path), model.max_len, model.client_address, model.secret,
                            Tokenizer.from_file(str(path / "tokenizer.json")), {"tp": 1, "pp": 2})
        await client.connect()
        before = ring_load()
        try:
            # Long enough to be still running when the head is asked (8 tokens could end before it is).
            outputs = client.generate(EngineRequest("sent", ids, max_tokens=n, temperature=0, ignore_eos=True))
            load = until(lambda load: load["running"] == 1)
            assert load["running"] == 1, load  # sent, with nothing iterated yet
            tokens = [t async for out in outputs for t in out.token_ids]
            unread = client.generate(EngineRequest("unread", ids, max_tokens=model.max_len - len(ids),
                                                   temperature=0, ignore_eos=True))
            assert until(lambda load: load["running"] == 1)["running"] == 1
            await unread.aclose()
            load = until(lambda load: load["running"] == 0)
            assert load["running"] == 0 and load["aborted"] == before["aborted"] + 1, load
            assert client.num_unfinished() == 0
            # the sampling fields and logprobs through the head client (the fast lane's engine)
            outs = [o async for o in client.generate(EngineRequest("proc", ids, max_tokens=8, temperature=0,
                                                                   ignore_eos=True, repetition_penalty=1.5,
                                                                   logprobs=2))]
            processed = ([t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs])
            bad = client.generate(EngineRequest("bad", [], max_tokens=4))
            with pytest.raises(EmptyPrompt):
                await bad.__anext__()
            return tokens, processed
        finally:
            client.close()

    from .test_engine import assert_logprobs_are_transformers

    tokens, (penalized, logprobs) = asyncio.run(run())
    assert tokens == hf_greedy(path, ids, n)
    assert penalized == hf_greedy(path, ids, 8, repetition_penalty=1.5)
    assert_logprobs_are_transformers(path, ids, penalized, logprobs, 2)


@_pipe([(1, 2, "tiny-full", EAGER)])
def test_abort_frees_the_slot_within_a_step_and_a_dead_chip_is_reported(pipe):
    model, path = pipe
    ids = prompt_ids(path, 6)
    for i in range(4):  # fill every slot, then abort them all mid-stream
        model.add(f"r{i}", ids, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    model.step()
    for i in range(4):
        assert model.abort(f"r{i}")
    assert not model.has_work and model.step() == []
    # Every slot is free again: four new requests fit at once and decode to the end.
    assert model.generate([ids] * 4, SamplingParams(temperature=0, max_tokens=3)) == [hf_greedy(path, ids, 3)] * 4
    model.check_alive()
    # A chip that is alive but gets no CPU (stopped here) is reported as unresponsive, not as gone,
    # and once it runs again the ring serves as before.
    pid = ray.get(model._workers[1].__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(ChipUnresponsive):
            model.check_alive(timeout_s=1)
    finally:
        os.kill(pid, signal.SIGCONT)
    model.check_alive()
    assert model.generate([ids], SamplingParams(temperature=0, max_tokens=3)) == [hf_greedy(path, ids, 3)]
    ray.kill(model._workers[1], no_restart=True)  # asynchronous: the actor may answer once more
    deadline = time.monotonic() + 30
    while True:
        try:
            model.check_alive()
        except RingFailed:
            break
        assert time.monotonic() < deadline, "a killed chip was still reported alive after 30 s"
        time.sleep(0.05)
    with pytest.raises(RingFailed):
        model.generate([ids], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))


def test_prompt_logits_in_process_match_transformers(tiny_dir):
    """The debug path is the executor's: the in-process engine answers it too."""
    from sharding.engine import Engine

    path = tiny_dir / "full"
    ids = prompt_ids(path, 12)
    engine = Engine.from_pretrained(path, num_slots=1)
    assert torch.allclose(engine.prompt_logits(ids), hf_logits(path, ids), atol=TOL)
    assert engine.cache.num_free == 1
