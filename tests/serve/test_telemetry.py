"""A real OTLP round trip: an in-process OTLP/gRPC receiver, an application exporting to it (set up
only by the OpenTelemetry environment variables), the fast lane at tp=2 x pp=2, one WebSocket
request carrying the caller's ``traceparent``; the trace must have the right shape. The app is the
one ``test_security.py`` uses (``tests.serve.conftest.SecureApp``), so it speaks TLS."""

from __future__ import annotations

import asyncio
import json
import time
import pytest
from websockets.asyncio.client import connect

from tests.serve.conftest import TraceReceiver
from tests.serve.test_metrics import hop_pairs

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(secure_app):
    """The app (``tests.serve.conftest.SecureApp``: tp=2 x pp=2 on 4 chips, TLS, exporting to an
    in-process OTLP receiver) and the receiver."""
    return secure_app.app, secure_app.receiver, secure_app.ssl_context()


def attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = ([getattr(x, x.WhichOneof("value")) for x in v.array_value.values] if kind == "array_value"
                      else getattr(v, kind))
    return out


@pytest.mark.slow
def test_one_trace_from_the_caller_down_to_each_hop(traced):
    app, receiver, tls = traced

    async def main():
        headers = {"Authorization": f"Bearer {app.key}"}
        async with connect(app.ws_url, additional_headers=headers, ssl=tls) as conn:
            await conn.send(json.dumps({"type": "response.create", "id": "t1", "model": "fastmode-fast",
                                        "input": "def main():\n", "max_output_tokens": 12, "temperature": 0,
                                        "metadata": {"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"}}))
            while (e := json.loads(await conn.recv()))["type"] not in ("response.completed", "error"):
                pass
            return e

    done = asyncio.run(main())
    assert done["type"] == "response.completed", done
    deadline = time.monotonic() + 30
    while True:
        spans = [(r, s) for r, s in receiver.spans if s.trace_id.hex() == TRACE_ID]
        names = [s.name for _, s in spans]
        if "text_completion fastmode-fast" in names and "fastmode.lane fast" in names \
                and names.count("fastmode.decode") >= 8:
            break
        assert time.monotonic() < deadline, names
        time.sleep(0.5)
    by_id = {s.span_id: s for _, s in spans}
    process = {s.span_id: r["fastmode.process"] for r, s in spans}

    request = next(s for s in by_id.values() if s.name == "text_completion fastmode-fast")
    assert request.parent_span_id.hex() == CALLER_SPAN  # continues the caller's trace
    assert request.kind == request.SPAN_KIND_SERVER and process[request.span_id] == "gateway"
    a = attrs(request)
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "fastmode-fast"
    assert a["gen_ai.usage.input_tokens"] == done["usage"]["input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == 12 and a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["gen_ai.server.time_to_first_token"] > 0 and a["fastmode.lane"] == "fast"

    lane = next(s for s in by_id.values() if s.name == "fastmode.lane fast")
    # The front door runs the fast lane's request path itself, streaming from the ring's head chip
    # (serve.lanes.head_links): the lane's span and its steps' come from the gateway's process.
    assert lane.parent_span_id == request.span_id and process[lane.span_id] == "gateway"
    totals = attrs(lane)
    steps = [s for s in by_id.values() if s.name in ("fastmode.prefill", "fastmode.decode")]
    assert all(s.parent_span_id == lane.span_id for s in steps)
    assert [s.name for s in steps].count("fastmode.prefill") == 1 and totals["fastmode.steps"] == 12
    assert len(steps) == 9  # prefill + the first 8 decode steps (telemetry.step_spans_first); 12 < 64
    for step in steps:
        s = attrs(step)
        assert (s["fastmode.tp"], s["fastmode.pp"]) == (2, 2)
        hops = [h for h in by_id.values() if h.parent_span_id == step.span_id]
        # head -> its TP peer, stage 0 -> stage 1 (each rank), stage 1 (each rank) -> head: the ring
        assert len(hops) == s["fastmode.hops.count"] == 5
        for hop in hops:
            h = attrs(hop)
            assert hop.name == f"fastmode.hop {h['fastmode.hop.src_chip']}->{h['fastmode.hop.dst_chip']}"
            # Every hop carries tensors but the other ranks' returns to the head (their hop records only).
            assert h["fastmode.hop.transport"] == "tcp" and (h["fastmode.hop.bytes"] > 0 or (
                h["fastmode.hop.src_stage"], h["fastmode.hop.dst_stage"]) == (1, 0))
            assert h["fastmode.hop.seconds"] > 0
            assert step.start_time_unix_nano <= hop.end_time_unix_nano
        stages = {(attrs(h)["fastmode.hop.src_stage"], attrs(h)["fastmode.hop.dst_stage"]) for h in hops}
        assert stages == {(0, 0), (0, 1), (1, 0)}
    assert totals["fastmode.hops.count"] >= 12 * 5 and totals["fastmode.hops.seconds_p99"] >= \
        totals["fastmode.hops.seconds_p50"] > 0
    # Per chip pair over every step (not only the sampled ones): 5 pairs, one hop each per step.
    assert len(totals["fastmode.hops.pair"]) == 5 and set(totals["fastmode.hops.pair_count"]) == {12}
    assert sum(totals["fastmode.hops.pair_count"]) == totals["fastmode.hops.count"]
    assert all(m > 0 for m in totals["fastmode.hops.pair_max_seconds"])
    # response.completed carries the same per-pair totals (for every response, traced or not).
    hops = done["hops"]
    assert [f"{h['src']}->{h['dst']}" for h in hops] == totals["fastmode.hops.pair"]
    assert [h["count"] for h in hops] == totals["fastmode.hops.pair_count"]
    assert [h["bytes"] for h in hops] == totals["fastmode.hops.pair_bytes"]
    assert [h["seconds"] for h in hops] == pytest.approx(totals["fastmode.hops.pair_seconds"])
    assert [h["max_seconds"] for h in hops] == pytest.approx(totals["fastmode.hops.pair_max_seconds"])


@pytest.mark.slow
def test_hop_metrics_label_each_chip_pair_of_the_ring(traced):
    app, *_ = traced
    assert app.lane_stats("fast")["layout"] == {"tp": 2, "pp": 2, "why": "set in the config"}
    status, _ = app.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=16)
    assert status == 200
    hops = hop_pairs(app.metrics_url, want=5)
    # tp=2 x pp=2: the head's token ids to its TP peer, rank r of stage 0 -> rank r of stage 1, and
    # both last-stage ranks back to the head; each labelled by chip.
    pairs = {(k.split("src_chip=")[1].split(",")[0], k.split("dst_chip=")[1].split(",")[0]) for k in hops}
    assert len(pairs) == 5 and all("/chip" in a and "/chip" in b for a, b in pairs)
    heads = {a for a, _ in pairs} & {b for _, b in pairs}
    assert all("transport=tcp" in k for k in hops) and len(heads) >= 1


def request_span(receiver: TraceReceiver, trace_id: str, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while True:
        found = [s for _, s in receiver.spans if s.trace_id.hex() == trace_id and s.kind == s.SPAN_KIND_SERVER]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no request span in trace {trace_id}"
        time.sleep(0.5)


@pytest.mark.slow
def test_http_headers_and_grpc_metadata_continue_the_callers_trace(traced):
    from clients.grpc_client import GrpcClient

    app, receiver, _ = traced
    http_trace, grpc_trace = "a" * 32, "b" * 32
    r = app.client.post("/v1/chat/completions", headers={"traceparent": f"00-{http_trace}-{CALLER_SPAN}-01"},
                        json={"model": "fastmode-full", "messages": [{"role": "user", "content": "x = 1"}],
                              "max_tokens": 4})
    assert r.status_code == 200, r.text
    with GrpcClient(app.grpc_target, api_key=app.key, ca_file=str(app.ca_file)) as client:
        # ignore_eos: sampled (gRPC's default temperature is 1), the fast model may end after 1 token
        assert client.generate("fastmode-fast", "x = 1\n", max_output_tokens=4, ignore_eos=True,
                               traceparent=f"00-{grpc_trace}-{CALLER_SPAN}-01")["usage"]["output_tokens"] == 4
    for trace_id, op in ((http_trace, "chat fastmode-full"), (grpc_trace, "text_completion fastmode-fast")):
        span = request_span(receiver, trace_id)
        assert span.name == op and span.parent_span_id.hex() == CALLER_SPAN


@pytest.mark.parametrize("carrier", [{"traceparent": 5}, {"traceparent": ["x"]}, {"traceparent": None},
                                     {"traceparent": "junk", 3: "x", "b": 4}, {}])
def test_a_carrier_that_is_not_strings_is_no_trace_context(carrier):
    """Hostile input: ``metadata: {"traceparent": 5}`` reached the propagator before validation,
    which raised ``TypeError``: an internal error instead of ``invalid_request`` naming the field."""
    from serve.telemetry import extract

    context = extract(carrier)
    assert context is None or not context  # nothing extracted: the request starts its own trace
