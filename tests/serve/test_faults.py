"""Faults on the running application: a chip, an engine process or the gateway killed mid-stream.

The contract (docs/operating.md): a request streaming on the lane that lost its
engine gets an ``error`` event with the stable, retryable code ``lane_unavailable`` (and
``retry_after``) within 5 s; the lane rebuilds its engine in place (the replica, its links and the
application stay), and a new request is served once it is rebuilt (within 120 s: a bound against a
hang, not a speed goal). A killed gateway's clients see the
connection drop, and the SDK reconnects and sends again what had produced no text yet.

Each process is killed with SIGKILL, found among the shared app's own descendants.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import psutil
import pytest
from websockets.sync.client import connect

from tests.serve.conftest import FIRST_REQUESTS

# kills engines, chips and servers and waits for their rebuilds: the full suite only (make test-all)
pytestmark = pytest.mark.full

ERROR_WITHIN_S = 5.0
SERVED_AGAIN_WITHIN_S = 120.0
"""A bound against a lane that never comes back, not a speed goal: a rebuild of a compiled lane
compiles its graphs again from inductor's cache, tens of seconds for the fast lane on a small CPU
host (docs/operating.md)."""


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie (an earlier test's killed process)
        return ""


def descendants(app, mark: str, under: str | None = None) -> list[psutil.Process]:
    """The app's live processes whose command line contains ``mark`` (below one containing ``under``)."""
    procs = psutil.Process(app.proc.pid).children(recursive=True)
    if under is not None:
        parents = [p for p in procs if under in _cmdline(p)]
        procs = [c for p in parents for c in p.children(recursive=True)]
    return [p for p in procs if mark in _cmdline(p)]


def stream_until_first_delta(app, lane: str):
    ws = connect(app.ws_url, additional_headers={"Authorization": f"Bearer {app.key}"}, max_size=None)
    ws.send(json.dumps({"type": "response.create", "id": "long", "input": "def main():\n", "temperature": 0,
                        "max_output_tokens": 500, "ignore_eos": True,
                        **FIRST_REQUESTS[lane]}))
    while True:
        event = json.loads(ws.recv(timeout=120))
        assert event["type"] != "error", event
        if event["type"] == "response.output_text.delta":
            return ws


def error_after_kill(ws) -> tuple[dict, float]:
    """The stream's end after its engine was killed, and how long it took to come."""
    t0 = time.perf_counter()
    while True:
        event = json.loads(ws.recv(timeout=60))
        if event["type"] in ("error", "response.completed"):
            return event, time.perf_counter() - t0


def served_again(app, lane: str) -> tuple[float, list[str]]:
    """Seconds until a new request on ``lane`` completes (retrying while the lane says
    ``lane_unavailable``), and the codes of the refusals meanwhile."""
    t0, refusals = time.perf_counter(), []
    while time.perf_counter() - t0 < SERVED_AGAIN_WITHIN_S:
        status, events = app.generate(input="x = 1\n", max_output_tokens=4, temperature=0, **FIRST_REQUESTS[lane])
        last = events[-1]
        if last["type"] == "done":
            return time.perf_counter() - t0, refusals
        refusals.append(last.get("code") or last.get("error", {}).get("code"))
        assert refusals[-1] == "lane_unavailable", (status, events)
        time.sleep(0.5)
    raise AssertionError(f"the {lane} lane did not serve again within {SERVED_AGAIN_WITHIN_S:.0f} s: "
                         f"{refusals[-3:]}")


def check_contract(app, lane: str, kill) -> None:
    ws = stream_until_first_delta(app, lane)
    try:
        with app.paused(lane):  # the stream is surely in flight when its engine dies
            kill()
        event, took = error_after_kill(ws)
    finally:
        ws.close()
    assert event["type"] == "error" and event["code"] == "lane_unavailable", event
    assert event.get("retry_after", 0) > 0, event
    assert took < ERROR_WITHIN_S, f"the error came {took:.1f} s after the kill"
    again, refusals = served_again(app, lane)
    assert again < SERVED_AGAIN_WITHIN_S, f"served again only after {again:.1f} s ({len(refusals)} refusals)"
    stats = app.lane_stats(lane)
    assert stats["rebuilds"] and stats["rebuilds"][-1]["ok"] and not stats["rebuilding"], stats["rebuilds"]
    rebuild = stats["rebuilds"][-1]
    print(f"{lane}: error {took:.2f} s after the kill, served again after {again:.1f} s (rebuild "
          f"{rebuild['seconds']:.1f} s: build {rebuild['build_s']:.1f} s, warm-up {rebuild['warmup_s']:.1f} s; "
          f"{len(refusals)} refusals meanwhile)")
    assert stats["running"] == 0 and stats["in_flight"] == 0, stats


@pytest.mark.slow
def test_a_fast_lane_chip_killed_mid_stream_errors_then_the_lane_rebuilds(app):
    a = app()
    chips = descendants(a, "ray::ChipWorker")
    assert chips, "no chip actor found"
    check_contract(a, "fast", lambda: chips[-1].send_signal(signal.SIGKILL))


@pytest.mark.slow
def test_a_vllm_engine_killed_mid_stream_errors_then_the_lane_rebuilds(app):
    a = app()
    engines = descendants(a, "VLLM::EngineCore", under="ServeReplica:fastmode:standard-lane")
    assert len(engines) == 1, engines
    workers = engines[0].children(recursive=True)  # vLLM's worker process(es)
    check_contract(a, "standard", lambda: engines[0].send_signal(signal.SIGKILL))
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"the killed engine's workers were left behind: {alive}"  # they would spin a core each


@pytest.mark.slow
def test_a_killed_gateway_comes_back_and_the_sdk_reconnects(app):
    from clients.sdk import AsyncClient, ConnectionLost

    a = app()

    async def main():
        async with AsyncClient(f"ws://127.0.0.1:{a.port}", api_key=a.key, backoff_initial_s=0.1) as client:
            await client.responses.create(model="fastmode-fast", input="x = 1\n", max_output_tokens=2)
            streaming = await client.responses.stream(model="fastmode-fast", input="def main():\n",
                                                      max_output_tokens=500, ignore_eos=True)
            async for _ in streaming:
                break
            [gateway] = descendants(a, "ServeReplica:fastmode:gateway")
            with a.paused("fast"):  # the stream cannot end before the gateway dies under it
                gateway.send_signal(signal.SIGKILL)
                t0 = time.perf_counter()
                # Sent at once, on the connection the client does not yet know is dead: no text came,
                # so the SDK reconnects (the gateway restarting meanwhile) and sends it again.
                pending = await client.responses.stream(model="fastmode-fast", input="x = 1\n",
                                                        max_output_tokens=2, temperature=0)
                with pytest.raises(ConnectionLost):  # it had streamed text: sending it again could repeat it
                    async for _ in streaming:
                        pass
            after = await pending.final()
            later = await client.responses.create(model="fastmode-fast", input="x = 1\n", max_output_tokens=2,
                                                  temperature=0)
            return after, pending.resubmits, later, time.perf_counter() - t0, client.connects

    after, resubmits, later, took, connects = asyncio.run(main())
    assert after.finish_reason == "length" and after.usage.output_tokens == 2 and resubmits >= 1
    assert later.text == after.text
    assert connects == 2, connects
    print(f"gateway back and serving {took:.1f} s after the kill")
    for _ in range(3):  # the test's HTTP client may still hold a connection to the killed gateway
        try:
            assert a.health()[0] == 200
            break
        except httpx.TransportError:
            time.sleep(0.5)


@pytest.mark.slow
def test_a_killed_grpc_server_fails_its_calls_unavailable_and_comes_back(app):
    """The gRPC server's replica killed mid-stream: the call in flight ends with UNAVAILABLE (a status
    gRPC clients retry on, never a hang), Serve restarts the replica, and a new call on the same
    channel is served again (within ``SERVED_AGAIN_WITHIN_S``); the lane holds nothing of the cut call."""
    import grpc

    from clients.grpc_client import GrpcClient

    a = app()
    with GrpcClient(a.grpc_target, api_key=a.key) as client:
        # ignore_eos: a sampled reply may end on eos within its 2 tokens ("stop"), which is not what this checks
        first = client.generate("fastmode-fast", "x = 1\n", max_output_tokens=2, ignore_eos=True)
        assert first["finish_reason"] == "length"
        call = client.stream("fastmode-fast", "def main():\n", max_output_tokens=500, ignore_eos=True, timeout=60)
        next(iter(call))  # streaming
        [server] = descendants(a, "ServeReplica:fastmode:grpc")
        with a.paused("fast"), pytest.raises(grpc.RpcError) as cut:  # the call cannot end before the kill
            server.send_signal(signal.SIGKILL)
            t0 = time.perf_counter()
            for _ in call:
                pass
        took = time.perf_counter() - t0
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE, cut.value
        assert took < ERROR_WITHIN_S, f"the call ended {took:.1f} s after the kill"
        codes = []
        while time.perf_counter() - t0 < 120:
            try:
                after = client.generate("fastmode-fast", "x = 1\n", max_output_tokens=2, timeout=10, ignore_eos=True)
                break
            except grpc.RpcError as e:
                codes.append(e.code())
                time.sleep(0.5)
        else:
            raise AssertionError(f"no gRPC call served within {SERVED_AGAIN_WITHIN_S:.0f} s of the kill: {codes[-3:]}")
        again = time.perf_counter() - t0
        for lane in ("standard", "priority", "exact"):  # the new replica links to every lane, as before
            model, tier = ("fastmode-full", None if lane == "standard" else lane)
            done = client.generate(model, "x = 1\n", max_output_tokens=2, timeout=60, temperature=0.0,
                                   **({"service_tier": tier} if tier else {}))
            assert done["lane"] == lane and done["finish_reason"] == "length", done
    assert after["finish_reason"] == "length" and after["usage"]["output_tokens"] == 2
    assert again < SERVED_AGAIN_WITHIN_S, f"served again only after {again:.1f} s"
    assert set(codes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
    deadline = time.monotonic() + 10
    while (stats := a.lane_stats("fast"))["running"] or stats["in_flight"]:  # the cut call's sequence freed
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    print(f"gRPC: the call ended {took:.2f} s after the kill, served again after {again:.1f} s")


@pytest.mark.slow
def test_a_client_that_vanishes_mid_stream_frees_its_sequence_on_every_lane_and_front_door(app):
    """A TCP reset (WebSocket, SSE) or a killed client process (gRPC) after the first token: the
    lane's engine holds the sequence no longer soon after (the bench reports the milliseconds). Each
    lane's engine is paused from the first token until the disconnect has reached it, so the stream
    cannot end on its own first."""
    from bench.soak import LANES, disconnects

    a = app()
    gone = asyncio.run(disconnects(a.base, a.ws_url, a.grpc_target, a.key, list(LANES), ["ws", "sse", "grpc"],
                                   hold=a.paused))
    assert len(gone) == 12, gone
    slow = [d for d in gone if d.get("freed_s") is None or d["freed_s"] > 2.0 or not d["cancelled_by_disconnect"]]
    assert not slow, slow
    for lane in LANES:
        assert a.lane_stats(lane)["running"] == 0


@pytest.mark.slow
def test_the_quick_soak_accounts_for_every_delta_and_leaks_nothing(app, tmp_path):
    from bench import soak

    a = app()
    out = tmp_path / "soak.json"
    soak.main(["--quick", "--url", a.base, "--grpc", a.grpc_target, "--api-key", a.key, "--json", out])
    doc = json.loads(out.read_text())
    led = doc["ledger"]
    assert led["requests"] >= 40 and not led["problems"] and led["without_terminal"] == 0, led
    assert led["ends"].get("completed", 0) > 0 and led["ends"].get("cancelled", 0) > 0, led["ends"]
    assert set(led["by_door"]) == {"ws", "sse", "grpc"}, led["by_door"]
    checks = doc["checks"]
    assert checks["no client failed"] and checks["engines hold nothing afterwards"], doc
    assert checks["every vanished client's sequence freed"], doc["disconnects"]
