"""Security defaults end to end, on apps of their own with a self-signed certificate made here.

- TLS: with ``http.tls_*`` and ``grpc.tls_*`` an https request, a wss stream (the SDK and
  ``fastmode chat``) and a gRPC call (``GrpcClient``, ``fastmode grpc-chat``) succeed when the
  client trusts the certificate, fail when it does not, and plain http / plaintext gRPC to the TLS
  ports fail; ``fastmode up`` prints https and wss URLs. Both HTTP servers: the gateway's own
  (``http.server: gateway``, the default) and Ray Serve's proxy (``http.server: serve``).
- Nothing secret in what the app writes: after requests with a distinctive prompt over every front
  door, a refused request that quotes it back, and a wrong key, neither the prompt, the outputs
  nor any key (right or wrong) appear in the app's spans (``FASTMODE_TRACE_FILE``), its console
  output, or any file under its Ray session directory (every process's logs).

- (Not security, but on this app to spare CI a start: ``cpus: auto`` places every process.)

The first app serves every check but Serve's proxy (one start, about two minutes here); its last
test stops it, so that every span and log line is flushed before they are read.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import grpc
import httpx
import pytest

from clients.grpc_client import GrpcClient
from clients.sdk import AsyncClient, AuthenticationError, ConnectionFailed
from tests.serve.conftest import API_KEY

PROMPT = "def canary_zq7vk_launch(codes):\n"
"""Distinctive, so that finding it anywhere means it was written there."""
WRONG_KEY = "sk-canary-wrong-3p9x"


def tls_yaml(cert: Path, key: Path, *, server: str = "gateway", grpc_on: bool = True) -> str:
    return (f"http: {{server: {server}, tls_certfile: {cert}, tls_keyfile: {key}}}\n"
            + (f"grpc: {{tls_certfile: {cert}, tls_keyfile: {key}}}\n" if grpc_on else "grpc: {enabled: false}\n"))


@pytest.fixture(scope="module")
def tls(secure_app):
    """The TLS app (``tests.serve.conftest.SecureApp``: the gateway's own server and gRPC over TLS,
    ``cpus: auto``, spans to a file), its CA file, span file and Ray temp dir."""
    return secure_app.app, secure_app.cert, secure_app.spans, secure_app.ray_tmp


@pytest.mark.slow
def test_fastmode_up_prints_https_and_wss_urls(tls):
    app, *_ = tls
    out = "".join(app.output)
    assert f"https://127.0.0.1:{app.port}/v1 " in out and f"wss://127.0.0.1:{app.port}/v1/responses" in out
    assert f"http://127.0.0.1:{app.port}" not in out and f"ws://127.0.0.1:{app.port}" not in out
    assert f"127.0.0.1:{app.grpc_port}   (TLS, fastmode.v1.Inference" in out
    # Ray's own default for the local cluster fastmode up starts: token authentication on.
    assert "Token authentication is enabled for this Ray cluster" in out


@pytest.mark.slow
def test_cpus_auto_keeps_serving_processes_off_the_engines_cores(tls):
    """``cpus: auto`` (sharding/cpus.py; this app sets it, to spare CI an app of its own): vLLM's
    engines (the engine-core processes that run the model, the lanes' default ``executor: uni``), the
    fast lane's chips (where they fit on them) and the exact lane's engine thread compute on the compute
    cores; the gateway, gRPC, lane replicas, Ray's daemons and the engines' gloo threads (idle pollers)
    run on the serving core, every other thread of them."""
    from serve.lanes.speculative_engine import THREAD_NAME

    import os

    import psutil

    from sharding import cpus

    plan = cpus.plan("auto")
    if plan is None:
        pytest.skip("a node with fewer than 2 CPUs, or with a GPU: nothing is placed")
    a, *_ = tls
    layout = a.lane_stats("fast")["layout"]
    # more chips than compute cores (this app's 4 on a 2-core node): the chips run on every CPU
    chips_on = set(plan.compute) if layout["tp"] * layout["pp"] <= len(plan.compute) else set(cpus.node_cpus())
    seen: dict[str, list[str]] = {"serving": [], "compute": []}
    for p in [psutil.Process(a.proc.pid), *psutil.Process(a.proc.pid).children(recursive=True)]:
        name = "fastmode up" if p.pid == a.proc.pid else p.cmdline()[0]
        if any(k in name for k in ("VLLM::Worker", "VLLM::EngineCore", "ray::ChipWorker")):
            role = "compute"
        elif any(k in name for k in ("ray::ServeReplica", "raylet", "gcs_server",
                                     "ray::ServeController", "fastmode up")):
            role = "serving"
        else:
            continue
        want = set(plan.serving if role == "serving" else chips_on if "ChipWorker" in name else plan.compute)
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                comm = Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().strip()
                mask = os.sched_getaffinity(int(tid))
            except (FileNotFoundError, ProcessLookupError):
                continue  # a short-lived thread ended between the listing and the read: nothing to check
            if comm == THREAD_NAME:  # the exact lane's engine, in its replica
                assert "exact-lane" in name and mask == set(plan.compute), (name, tid, mask)
                seen["compute"].append(f"{name}: {THREAD_NAME}")
            elif comm in cpus.IDLE_POLLERS and "VLLM::" in name:  # a vLLM engine's gloo threads: no collective
                # at world size 1 (a chip's, of its tensor-parallel group, stay with the chip)
                assert mask == set(plan.serving), (name, tid, comm, mask)
                seen["serving"].append(f"{name}: {comm}")
            else:
                assert mask == want, f"{name} (pid {p.pid}): thread {tid} off {sorted(want)}: {mask}"
        seen[role].append(name)
    assert sum("VLLM::EngineCore" in n for n in seen["compute"]) == 2, seen  # priority, standard
    assert sum("VLLM::EngineCore" in n and n.endswith(": gloo_tcp_loop") for n in seen["serving"]) >= 2, seen
    assert sum(THREAD_NAME in n for n in seen["compute"]) == 1, seen  # exact (fastmode's engine)
    assert not any("VLLM::Worker" in n for n in seen["compute"]), seen  # uni: no worker process
    assert any("ChipWorker" in n for n in seen["compute"]), seen
    for name in ("gateway", "standard-lane", "fast-lane", "grpc", "raylet"):
        assert any(name in n for n in seen["serving"]), (name, seen)


@pytest.mark.slow
def test_https_works_and_plain_http_or_an_untrusted_certificate_fail(tls):
    app, cert, *_ = tls
    r = app.client.post("/v1/chat/completions", json={"model": "fastmode-fast", "max_tokens": 24, "temperature": 0,
                                                       "messages": [{"role": "user", "content": PROMPT}]})
    assert r.status_code == 200, r.text
    app.seen.append(r.json()["choices"][0]["message"]["content"])
    assert app.client.get("/health").status_code == 200
    with pytest.raises(httpx.TransportError):  # plain http to the TLS port: no HTTP answer at all
        httpx.get(f"http://127.0.0.1:{app.port}/health", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # the system trust store
        httpx.get(f"{app.base}/health", timeout=10)


@pytest.mark.slow
def test_wss_streams_with_the_sdk_and_fastmode_chat(tls, capsys):
    app, cert, *_ = tls

    async def main():
        async with AsyncClient(f"wss://127.0.0.1:{app.port}", API_KEY, ca_file=str(cert)) as client:
            stream = await client.responses.stream(model="fastmode-fast", input=PROMPT, max_output_tokens=24,
                                                   temperature=0)
            chunks = [text async for text in stream]
            return chunks, stream.result

    chunks, result = asyncio.run(main())
    assert result.finish_reason in ("length", "stop") and "".join(chunks) == result.text and result.text
    app.seen.append(result.text)

    async def untrusted():
        async with AsyncClient(f"wss://127.0.0.1:{app.port}", API_KEY, max_attempts=1) as client:
            await client.responses.create(model="fastmode-fast", input="x", max_output_tokens=1)

    with pytest.raises(ConnectionFailed, match="certificate is not trusted"):
        asyncio.run(untrusted())

    from clients.chat import main as chat_main

    assert chat_main([PROMPT, "--url", f"https://127.0.0.1:{app.port}", "--ca-file", str(cert),
                      "--api-key", API_KEY, "--model", "fastmode-fast", "--max-tokens", "24", "--temperature",
                      "0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["text"] == result.text and r["lane"] == "fast"  # greedy: the same text


@pytest.mark.slow
def test_grpc_over_tls_and_plaintext_refused(tls, capsys):
    app, cert, *_ = tls
    with GrpcClient(app.grpc_target, API_KEY, ca_file=str(cert)) as client:
        r = client.generate("fastmode-fast", PROMPT, max_output_tokens=24, temperature=0)
        assert r["lane"] == "fast" and r["usage"]["output_tokens"] > 0
        app.seen.append(r["text"])
        with pytest.raises(grpc.RpcError) as e:  # TLS, but the wrong key
            GrpcClient(app.grpc_target, WRONG_KEY, ca_file=str(cert)).models()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with GrpcClient(app.grpc_target, API_KEY) as plain, pytest.raises(grpc.RpcError) as e:
        plain.generate("fastmode-fast", "x", max_output_tokens=1, timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    with GrpcClient(app.grpc_target, API_KEY, tls=True) as untrusted, pytest.raises(grpc.RpcError) as e:
        untrusted.generate("fastmode-fast", "x", max_output_tokens=1, timeout=10)  # gRPC's own roots
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    from clients.grpc_chat import main as grpc_chat_main

    assert grpc_chat_main([PROMPT, "--target", app.grpc_target, "--ca-file", str(cert), "--api-key", API_KEY,
                           "--model", "fastmode-fast", "--max-tokens", "24", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == r["text"]


def _readable_files(root: Path):
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                yield path, path.read_bytes()
            except OSError:
                continue


@pytest.mark.slow
def test_no_key_prompt_or_output_in_spans_or_logs(tls):
    app, cert, spans, ray_tmp = tls
    # Requests over every front door, with the distinctive prompt...
    with app.stream(model="fastmode-full", input=PROMPT, max_output_tokens=24, temperature=0) as (status, events):
        events = list(events)
    assert status == 200, events
    app.seen.append("".join(e["text"] for e in events if e["type"] == "delta"))
    # ...one refused with a message that quotes it back to the caller...
    status, events = app.generate(model="fastmode-fast", input=[{"role": "wizard", "content": PROMPT}])
    assert status == 400 and "canary_zq7vk" in events[0]["message"]
    # ...and wrong keys, on HTTP and the WebSocket.
    r = httpx.post(f"{app.base}/v1/generate", headers={"Authorization": f"Bearer {WRONG_KEY}"}, json={
        "model": "fastmode-fast", "input": PROMPT}, verify=str(cert))
    assert r.status_code == 401

    async def wrong_key_ws():
        async with AsyncClient(app.ws_url, WRONG_KEY, ca_file=str(cert), max_attempts=1) as client:
            await client.responses.create(model="fastmode-fast", input=PROMPT, max_output_tokens=1)

    with pytest.raises(AuthenticationError):
        asyncio.run(wrong_key_ws())
    assert app.stop() == 0  # flushes every span processor and log

    secrets = {"the prompt": "canary_zq7vk", "the API key": API_KEY, "the other API key": "sk-other",
               "the wrong key": WRONG_KEY}
    for i, text in enumerate(app.seen):  # each output's longest stretch that JSON and logs write as is
        stretch = max(re.split(r'[\n"\\]', text), key=len).strip()
        if len(stretch) >= 12:
            secrets[f"output {i}"] = stretch
    assert len(secrets) >= 6, app.seen  # most outputs are long enough to be told apart

    span_text = spans.read_text()
    found = [json.loads(line) for line in span_text.splitlines()]
    names = {s["name"] for batch in found for rs in batch["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]}
    assert {"chat fastmode-fast", "text_completion fastmode-full", "fastmode.lane fast"} <= names, names
    assert '"invalid_request"' in span_text  # the refused request's span: its code, not its message
    files = list(_readable_files(ray_tmp))
    assert any(p.suffix in (".log", ".out", ".err") and data for p, data in files), "no Ray logs found"
    places = [("spans", span_text.encode()), ("console", "".join(app.output).encode())] + [
        (str(p.relative_to(ray_tmp)), data) for p, data in files]
    leaks = [(what, where) for what, secret in secrets.items() for where, data in places
             if secret.encode() in data]
    assert not leaks, leaks


# Ray Serve's proxy with TLS (http.server: serve) is tested on the dashboard test's app, which runs
# behind the proxy anyway: tests/infra/test_prometheus_grafana.py::test_serves_proxy_serves_https_and_wss.
