"""The SDK: against a local dummy server (reconnects, backoff, typed close errors; fast) and against
the running application (every lane, 20 concurrent streams, sync client, typed errors, cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from websockets.asyncio.server import serve

from bench.soak import cancelled
from clients.sdk import (AsyncClient, AuthenticationError, Client, ConnectionFailed, ConnectionLost,
                         FastmodeError, InternalError, InvalidRequest, LaneUnavailable, Overloaded,
                         PreviousResponseNotFound, SlowConsumer, UnknownModel, UnsupportedParameter, from_code, responses_url)
from tests.serve.conftest import free_port, text_of

LANES = {"fast": ("fastmode-fast", None), "priority": ("fastmode-full", "priority"),
         "standard": ("fastmode-full", None)}
PROMPT = "def main():\n"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


# -- a dummy server ----------------------------------------------------------------------------
class Dummy:
    """Speaks just enough of the protocol: each create gets created, two deltas and completed. With
    ``drop_first``, the first connection is dropped (no close handshake) after the first delta;
    with ``close_code``, every connection is closed with that code at once."""

    def __init__(self, drop_first: bool = False, close_code: int | None = None, drop_before_text: int = 0,
                 keeps: bool = True) -> None:
        self.drop_first, self.close_code = drop_first, close_code
        self.keeps = keeps
        """Keep completed responses for ``previous_response_id`` on their connection (as the server
        does); ``False``: keep none, as if each was evicted at once."""
        self.drop_before_text = drop_before_text
        """Drop this many connections (no close handshake) right after a create, before any text."""
        self.connections = 0
        self.creates: list[dict] = []
        self.headers: list[str | None] = []

    async def handler(self, ws) -> None:
        self.connections += 1
        n = self.connections
        self.headers.append(ws.request.headers.get("Authorization"))
        if self.close_code is not None:
            await ws.close(self.close_code, "bad key")
            return
        kept: set[str] = set()  # this connection's completed responses
        async for raw in ws:
            event = json.loads(raw)
            if event["type"] == "response.cancel":
                await ws.send(json.dumps({"type": "response.cancelled", "id": event["id"]}))
                continue
            self.creates.append(event)
            rid = event["id"]
            if event.get("previous_response_id") is not None and event["previous_response_id"] not in kept:
                await ws.send(json.dumps({"type": "error", "id": rid, "code": "previous_response_not_found",
                                          "message": "no such response on this connection"}))
                continue
            if self.keeps:
                kept.add(rid)
            await ws.send(json.dumps({"type": "response.created", "id": rid, "lane": "fast",
                                      "model": event["model"], "input_tokens": 3, "route": {"by": "model"},
                                      "protocol": "fastmode.responses.v1"}))
            if n <= self.drop_before_text:  # e.g. the gateway died before the first token
                ws.transport.abort()
                return
            await ws.send(json.dumps({"type": "response.output_text.delta", "id": rid, "seq": 0,
                                      "delta": "hello"}))
            if self.drop_first and n == 1:
                ws.transport.abort()
                return
            if event["model"] == "slow":
                continue  # never ends unless cancelled
            await ws.send(json.dumps({"type": "response.output_text.delta", "id": rid, "seq": 1,
                                      "delta": " world"}))
            await ws.send(json.dumps({
                "type": "response.completed", "id": rid, "finish_reason": "length",
                "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
                "timing": {"ttft_s": 0.01, "engine_ttft_s": 0.005, "decode_tokens_per_s": 100.0,
                           "total_s": 0.02},
                "cost_units": 0.001, "lane": "fast", "model": event["model"]}))

    async def __aenter__(self) -> str:
        self.server = await serve(self.handler, "127.0.0.1", 0)
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()


def test_url_and_error_mapping():
    assert responses_url("ws://h:1") == "ws://h:1/v1/responses"
    assert responses_url("http://h:1/") == "ws://h:1/v1/responses"
    assert responses_url("wss://h/custom") == "wss://h/custom"
    assert responses_url("https://h:1") == "wss://h:1/v1/responses"
    assert AsyncClient("https://h:1", ca_file="ca.pem").ca_file == "ca.pem"
    with pytest.raises(ValueError, match="ca_file is for a wss:// .* server, not ws://h:1/v1/responses"):
        AsyncClient("ws://h:1", ca_file="ca.pem")
    for code, cls in [("invalid_request", InvalidRequest), ("invalid_json", InvalidRequest),
                      ("prompt_too_long", InvalidRequest), ("duplicate_id", InvalidRequest),
                      ("unknown_model", UnknownModel), ("overloaded", Overloaded),
                      ("unsupported_parameter", UnsupportedParameter),
                      ("lane_unavailable", LaneUnavailable),
                      ("slow_consumer", SlowConsumer), ("internal_error", InternalError)]:
        assert type(from_code(code, "m")) is cls and from_code(code).code == code
    e = from_code("something_new", "why", 1.5)
    assert type(e) is FastmodeError and (e.code, e.message, e.retry_after) == ("something_new", "why", 1.5)
    assert isinstance(UnknownModel(), InvalidRequest)


def test_stream_create_cancel_and_key_on_a_dummy_server(monkeypatch):
    monkeypatch.setenv("FASTMODE_API_KEY", "sk-env")
    dummy = Dummy()

    async def main():
        async with dummy as url, AsyncClient(url) as client:
            stream = await client.responses.stream(model="m", input="x", temperature=0, max_output_tokens=2)
            assert stream.lane == "fast"
            texts = [t async for t in stream]
            r = await client.responses.create(model="m", input="x")
            slow = await client.responses.stream(model="slow", input="x")
            await slow.cancel()
            broken = await client.responses.stream(model="slow", input="x")
            async for _ in broken:
                break  # leaving the loop sends response.cancel
            assert (await broken.final()).finish_reason == "cancelled"
            return texts, stream.result, r, slow.result, client.connects

    texts, streamed, created, cancelled, connects = run(main())
    assert texts == ["hello", " world"] and streamed.text == created.text == "hello world"
    assert streamed.usage.output_tokens == 2 and streamed.timing.decode_tokens_per_s == 100.0
    assert streamed.finish_reason == "length" and streamed.route == {"by": "model"}
    assert streamed.cost_units == 0.001
    assert cancelled.finish_reason == "cancelled" and cancelled.text == "hello"
    assert connects == 1 and dummy.connections == 1  # one connection for every call
    assert dummy.headers == ["Bearer sk-env"]
    assert dummy.creates[0]["temperature"] == 0
    assert "top_p" not in dummy.creates[0]  # None: left to the server's default


def test_a_dropped_connection_fails_in_flight_responses_and_the_next_call_reconnects():
    dummy = Dummy(drop_first=True)

    async def main():
        async with dummy as url, AsyncClient(url, backoff_initial_s=0.01) as client:
            stream = await client.responses.stream(model="m", input="x")
            got = []
            with pytest.raises(ConnectionLost) as lost:
                async for text in stream:
                    got.append(text)
            after = await client.responses.create(model="m", input="x")
            return got, lost.value, after, client.connects

    got, lost, after, connects = run(main())
    assert got == ["hello"] and lost.code == "connection_lost" and lost.response_id
    assert after.text == "hello world" and after.finish_reason == "length"
    assert connects == 2 and dummy.connections == 2


def test_a_response_dropped_before_its_first_text_is_resubmitted_on_a_new_connection():
    dummy = Dummy(drop_before_text=2)

    async def main():
        async with dummy as url, AsyncClient(url, backoff_initial_s=0.01) as client:
            stream = await client.responses.stream(model="m", input="x", max_output_tokens=2)
            texts = [t async for t in stream]
            return texts, stream, client.connects

    texts, stream, connects = run(main())
    assert texts == ["hello", " world"] and stream.result.finish_reason == "length"
    assert stream.resubmits == 2 and connects == 3 and dummy.connections == 3
    assert len(dummy.creates) == 3 and len({c["id"] for c in dummy.creates}) == 1  # the same request each time


def test_resubmits_are_bounded_and_never_repeat_text():
    async def main():
        async with Dummy(drop_before_text=3) as url, AsyncClient(url, backoff_initial_s=0.01,
                                                                 resubmit_attempts=2) as client:
            stream = await client.responses.stream(model="m", input="x")
            with pytest.raises(ConnectionLost):
                async for _ in stream:
                    pass
            bounded = stream.resubmits
        async with Dummy(drop_first=True) as url, AsyncClient(url, backoff_initial_s=0.01) as client:
            stream = await client.responses.stream(model="m", input="x")
            with pytest.raises(ConnectionLost):  # "hello" was seen: sending it again could repeat it
                async for _ in stream:
                    pass
            return bounded, stream.resubmits

    bounded, after_text = run(main())
    assert bounded == 2 and after_text == 0


def test_previous_response_id_on_a_new_connection_sends_the_conversation_whole():
    """A turn continuing a response that completed on an earlier connection: the new connection's
    server does not have it, so the client sends the whole conversation as input instead."""
    dummy = Dummy()

    async def main():
        async with dummy as url, AsyncClient(url, backoff_initial_s=0.01) as client:
            first = await client.responses.create(model="m", input="x")
            same = await client.responses.stream(model="m", input="y", previous_response_id=first.id)
            await same.final()
            await client._conn.close()  # e.g. the gateway closed an idle connection
            other = await client.responses.stream(model="m", input=[{"role": "user", "content": "z"}],
                                                  previous_response_id=same.id)
            await other.final()
            return first, same, other, client.connects

    first, same, other, connects = run(main())
    assert connects == 2 and not same.replayed and other.replayed
    assert dummy.creates[1]["previous_response_id"] == first.id and dummy.creates[1]["input"] == "y"
    assert "previous_response_id" not in dummy.creates[2]
    said = {"role": "assistant", "content": "hello world"}
    assert dummy.creates[2]["input"] == [{"role": "user", "content": "x"}, said, {"role": "user", "content": "y"}, said,
                                         {"role": "user", "content": "z"}]
    assert other.result.text == "hello world"


def test_a_previous_response_the_server_evicted_is_replayed_once_and_an_unknown_one_fails_typed():
    dummy = Dummy(keeps=False)

    async def main():
        async with dummy as url, AsyncClient(url, backoff_initial_s=0.01) as client:
            first = await client.responses.create(model="m", input="x")
            again = await client.responses.stream(model="m", input="y", previous_response_id=first.id)
            await again.final()
            with pytest.raises(PreviousResponseNotFound):
                await client.responses.create(model="m", input="y", previous_response_id="resp_unknown")
            small = AsyncClient(url, history_responses=0)  # keeps nothing: the server's answer stands
            async with small:
                kept_none = await small.responses.create(model="m", input="x")
                with pytest.raises(PreviousResponseNotFound):
                    await small.responses.create(model="m", input="y", previous_response_id=kept_none.id)
            return again

    again = run(main())
    assert again.replayed and again.result.text == "hello world"
    sent = [c for c in dummy.creates if c["id"] == again.id]
    assert [c.get("previous_response_id") for c in sent] == [sent[0]["previous_response_id"], None]
    assert sent[1]["input"] == [{"role": "user", "content": "x"}, {"role": "assistant", "content": "hello world"},
                                {"role": "user", "content": "y"}]


def test_a_closed_port_is_retried_with_backoff_then_fails_typed():
    port = free_port()
    waits = []

    class Counting(AsyncClient):
        def backoff_s(self, attempt):
            waits.append(super().backoff_s(attempt))
            return waits[-1]

    async def main():
        client = Counting(f"ws://127.0.0.1:{port}", max_attempts=4, backoff_initial_s=0.01,
                          backoff_max_s=0.02)
        with pytest.raises(ConnectionFailed) as failed:
            await client.responses.create(model="m", input="x")
        await client.close()
        return failed.value

    t0 = time.monotonic()
    failed = run(main())
    assert isinstance(failed, ConnectionLost) and failed.code == "connection_failed"
    assert "4 attempt" in failed.message
    assert len(waits) == 3 and all(0.005 <= w <= 0.02 for w in waits), waits  # capped, jittered
    assert time.monotonic() - t0 < 5
    c = AsyncClient(backoff_initial_s=1, backoff_max_s=4)
    assert [c.backoff_s(n) <= cap for n, cap in [(1, 1), (2, 2), (3, 4), (9, 4)]] == [True] * 4
    assert all(c.backoff_s(3) >= 2 for _ in range(20))


def test_a_server_that_comes_up_during_backoff_is_reached():
    dummy, port = Dummy(), free_port()

    async def main():
        client = AsyncClient(f"ws://127.0.0.1:{port}", max_attempts=20, backoff_initial_s=0.05,
                             backoff_max_s=0.1)
        call = asyncio.ensure_future(client.responses.create(model="m", input="x"))
        await asyncio.sleep(0.3)
        async with serve(dummy.handler, "127.0.0.1", port):
            r = await call
            await client.close()
        return r

    assert run(main()).text == "hello world"


def test_close_code_1008_is_an_authentication_error():
    async def main():
        async with Dummy(close_code=1008) as url, AsyncClient(url, api_key="sk-wrong") as client:
            with pytest.raises(AuthenticationError) as e:
                await client.responses.create(model="m", input="x")
            return e.value

    assert run(main()).code == "unauthorized"


def test_sync_client_on_a_dummy_server():
    dummy = Dummy()

    async def serve_forever(started, stop):
        async with dummy as url:
            started.set_result(url)
            await stop

    import threading
    loop = asyncio.new_event_loop()
    started, stop = loop.create_future(), loop.create_future()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve_forever(started, stop),))
    thread.start()
    try:
        url = asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(started), 10), loop).result()
        with Client(url, api_key="k") as client:
            stream = client.responses.stream(model="m", input="x")
            assert list(stream) == ["hello", " world"] and stream.result.text == "hello world"
            assert client.responses.create(model="m", input="x").usage.total_tokens == 5
            slow = client.responses.stream(model="slow", input="x")
            for _ in slow:
                break  # leaving the loop cancels
            assert slow.result.finish_reason == "cancelled"
    finally:
        loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
    assert dummy.connections == 1


# -- against the running application -----------------------------------------------------------
def reference(a, lane: str, n: int = 24) -> str:
    model, tier = LANES[lane]
    status, events = a.generate(model=model, service_tier=tier, input=PROMPT, max_output_tokens=n,
                                temperature=0)
    assert status == 200, events
    return text_of(events)


@pytest.mark.slow
def test_every_lane_streams_the_text_create_returns(app):
    a = app()

    async def main():
        out = {}
        async with AsyncClient(a.base, api_key=a.key) as client:
            for lane, (model, tier) in LANES.items():
                stream = await client.responses.stream(model=model, service_tier=tier, input=PROMPT,
                                                       max_output_tokens=24, temperature=0)
                texts = [t async for t in stream]
                created = await client.responses.create(model=model, service_tier=tier, input=PROMPT,
                                                        max_output_tokens=24, temperature=0)
                out[lane] = texts, stream.result, created
            return out, client.connects

    out, connects = run(main())
    assert connects == 1
    layout = a.lane_stats("fast")["layout"]
    for lane, (texts, streamed, created) in out.items():
        assert streamed.lane == created.lane == lane, (lane, streamed)
        assert "".join(texts) == streamed.text == created.text == reference(a, lane)
        usage, timing = streamed.usage, streamed.timing
        assert usage.output_tokens == 24 and usage.total_tokens == 24 + usage.input_tokens
        assert timing.ttft_s > 0 and timing.decode_tokens_per_s > 0 and timing.total_s > 0
        assert streamed.cost_units > 0 and streamed.finish_reason == "length"
        assert streamed.route["by"] == "model"
        assert streamed.model == LANES[lane][0]
        # The fast lane reports its ring's hops: none on one chip (the planner's pick for the shared
        # app depends on the machine's caches; tests/serve/test_playground.py has a ring of four), each
        # link once per token on more; the vLLM lanes have none to report.
        if lane == "fast":
            chips = layout["tp"] * layout["pp"]
            for hops in (streamed.hops, created.hops):
                assert (hops == []) == (chips == 1) and all(h["count"] == 24 for h in hops), (layout, hops)
            assert [(h["src"], h["dst"]) for h in streamed.hops] == [(h["src"], h["dst"]) for h in created.hops]
        else:
            assert streamed.hops is None and created.hops is None, (lane, streamed.hops)


@pytest.mark.slow
def test_door_client_streams_the_fast_lanes_text_from_its_door(app):
    a = app()

    async def main():
        async with AsyncClient(a.base, api_key=a.key, door=True) as client:
            stream = await client.responses.stream(model="fastmode-fast", input=PROMPT, max_output_tokens=24,
                                                   temperature=0)
            texts = [t async for t in stream]
            with pytest.raises(UnknownModel):  # the door serves the fast model only
                await client.responses.create(model="fastmode-full", input=PROMPT, max_output_tokens=4)
            return texts, stream.result, client.connects, client._conn.ws.remote_address[1]

    texts, result, connects, port = run(main())
    assert "".join(texts) == result.text == reference(a, "fast")
    assert result.lane == "fast" and result.usage.output_tokens == 24 and connects == 1
    door = a.client.get("/v1/door").json()["data"][0]["url"]
    assert port != a.port and door.endswith(f":{port}/v1/responses")  # the door's port, not the gateway's

    async def refused():
        async with AsyncClient(a.base, api_key="sk-wrong", door=True) as client:
            await client.responses.create(model="fastmode-fast", input=PROMPT, max_output_tokens=4)

    with pytest.raises(AuthenticationError):
        run(refused())


@pytest.mark.slow
def test_twenty_concurrent_streams_share_one_connection(app):
    """Twenty streams on one connection, each its own text: a ``logit_bias`` forces stream i to repeat
    token i, so any delta delivered to the wrong stream shows, whatever the batches were (greedy
    output of a batched lane may differ from a lone request's at a near tie)."""
    from transformers import AutoTokenizer

    from models import TEST_FULL
    from tests.conftest import shipped

    a = app()
    tok = AutoTokenizer.from_pretrained(shipped(TEST_FULL))
    words = [t for t in range(300, 600) if tok.decode([t]).strip().isalpha()
             and t not in tok.all_special_ids][:20]

    async def one(client, i):
        lane = ["fast", "standard"][i % 2]
        model, tier = LANES[lane]
        stream = await client.responses.stream(model=model, service_tier=tier, input=PROMPT, max_output_tokens=12,
                                               temperature=0, ignore_eos=True, logit_bias={str(words[i]): 100})
        return i, lane, "".join([t async for t in stream]), stream.result

    async def main():
        async with AsyncClient(a.ws_url, api_key=a.key) as client:
            results = await asyncio.gather(*(one(client, i) for i in range(20)))
            return results, client.connects

    results, connects = run(main())
    assert connects == 1 and len(results) == 20
    for i, lane, text, r in results:
        assert r.finish_reason == "length" and r.lane == lane and text == r.text == tok.decode([words[i]] * 12)
    assert len({r.id for *_, r in results}) == 20


@pytest.mark.slow
def test_sync_client_streams_and_creates(app):
    a = app()
    ref = reference(a, "fast")
    with Client(a.base, api_key=a.key) as client:
        stream = client.responses.stream(model="fastmode-fast", input=PROMPT, max_output_tokens=24,
                                         temperature=0)
        assert stream.lane == "fast"
        assert "".join(stream) == stream.result.text == ref
        r = client.responses.create(model="fastmode-fast", input=PROMPT, max_output_tokens=24, temperature=0)
        assert r.text == ref and r.usage.output_tokens == 24 and r.timing.ttft_s > 0


@pytest.mark.slow
def test_server_errors_are_typed_and_the_client_serves_on(app):
    a = app()

    async def main():
        async with AsyncClient(a.base, api_key=a.key) as client:
            with pytest.raises(UnknownModel) as unknown:
                await client.responses.create(model="nope", input="x")
            with pytest.raises(InvalidRequest) as bad:
                await client.responses.create(model="fastmode-fast", input="x", temperature=9)
            ok = await client.responses.create(model="fastmode-fast", input=PROMPT, max_output_tokens=4,
                                               temperature=0)
            connects = client.connects
            with pytest.raises(InvalidRequest) as big:  # the server closes with 1009 after saying why
                await client.responses.create(model="fastmode-fast", input="x" * (2**20 + 10))
            again = await client.responses.create(model="fastmode-fast", input=PROMPT, max_output_tokens=4,
                                                  temperature=0)
            return unknown.value, bad.value, ok, connects, big.value, again, client.connects

    unknown, bad, ok, connects, big, again, reconnects = run(main())
    assert unknown.code == "unknown_model" and "fastmode-fast" in unknown.message
    assert bad.code == "invalid_request" and "temperature" in bad.message
    assert ok.finish_reason == "length" and ok.usage.output_tokens == 4 and connects == 1
    assert big.code == "frame_too_large" and again.text == ok.text and reconnects == 2

    async def wrong_key():
        async with AsyncClient(a.base, api_key="sk-wrong") as client:
            with pytest.raises(AuthenticationError) as e:
                await client.responses.create(model="fastmode-fast", input="x")
            return e.value

    assert run(wrong_key()).code == "unauthorized"


@pytest.mark.slow
def test_leaving_the_loop_early_cancels_on_the_server(app):
    a = app()
    before = cancelled(a.lane_stats("fast"))

    async def main():
        async with AsyncClient(a.base, api_key=a.key) as client:
            stream = await client.responses.stream(model="fastmode-fast", input=PROMPT, max_output_tokens=400,
                                                   ignore_eos=True)
            with contextlib.ExitStack() as hold:
                async for _ in stream:  # the first delta: then the stream cannot end before the cancel
                    fast = hold.enter_context(a.paused("fast"))  # has reached the head
                    break
                await asyncio.sleep(0)  # the SDK sends response.cancel
                fast.reached_engine()
            deadline = time.monotonic() + 30
            while (s := a.lane_stats("fast"))["running"] or s["in_flight"]:
                assert time.monotonic() < deadline, s
                await asyncio.sleep(0.2)
            return await stream.final(), s  # the rest: the deltas already sent, then response.cancelled

    final, stats = run(main())
    assert cancelled(stats) == before + 1, stats
    assert final.finish_reason == "cancelled" and final.usage is None


@pytest.mark.slow
def test_a_turn_continued_on_a_new_connection_equals_the_history_sent_whole(app):
    """On the running application: a conversation's second turn after the connection changed (the
    client replays its history) answers what the same conversation sent whole on a fresh client
    answers, greedy, on the fast and the standard lane."""
    a = app()

    async def main():
        out = {}
        for lane in ("fast", "standard"):
            model, tier = LANES[lane]
            params = {"model": model, "service_tier": tier, "max_output_tokens": 12, "temperature": 0}
            async with AsyncClient(a.base, api_key=a.key) as client:
                first = await client.responses.create(input=PROMPT, **params)
                await client._conn.close()  # the connection the first turn completed on is gone
                second = await client.responses.stream(input="    return 1\n", previous_response_id=first.id, **params)
                await second.final()
            async with AsyncClient(a.base, api_key=a.key) as fresh:
                whole = await fresh.responses.create(input=[
                    {"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.text},
                    {"role": "user", "content": "    return 1\n"}], **params)
            out[lane] = second, whole
        return out

    for lane, (second, whole) in run(main()).items():
        assert second.replayed and second.result.text == whole.text and whole.text, (lane, second.result, whole)
        assert second.result.input_tokens == whole.input_tokens == second.input_tokens
