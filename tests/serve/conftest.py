"""``App``: a ``fastmode up`` in a subprocess and clients for it. The shared instance is the
session fixture ``app`` (``tests/conftest.py``); tests talk to it over HTTP, the WebSocket and gRPC,
as users do."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from bench.app import free_port
from tests.conftest import eager_lanes  # noqa: F401 - the tests' own apps import it from here
from tests.pause import Paused, chip_processes, paused, title

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 900
"""How long ``fastmode up`` may take to become ready: the tests' apps run the fast and exact lanes eager
(``eager_lanes``) and start in a minute or two on a 2-core machine; one with a compiled lane and
inductor's cache cold (a checkout at a new path compiles every graph again) takes minutes more."""
API_KEY = "sk-fastmode-test"
"""The shared app requires this key (FASTMODE_API_KEYS), so authentication is on in every test."""


FIRST_REQUESTS = {"fast": {"model": "fastmode-fast"}, "priority": {"model": "fastmode-full", "service_tier": "priority"},
                  "standard": {"model": "fastmode-full"}, "exact": {"model": "fastmode-full", "service_tier": "exact"}}
"""The request each lane gets first (``App.probe_first_requests``)."""


USER_RAY_AUTH_MODE = {k: v for k, v in os.environ.items() if k == "RAY_AUTH_MODE"}
"""``RAY_AUTH_MODE`` as the user set it when the tests started. A local ``ray.init`` in this process
(earlier tests') sets it to ``token`` in ``os.environ``; the apps start from the user's environment,
so that ``fastmode up`` meets Ray's default for a new local cluster as a user's would."""


class PausedLane:
    """A lane whose engine processes ``App.paused`` has stopped (``tests.pause``)."""

    def __init__(self, app: App, lane: str, state: Paused) -> None:
        self.app, self.lane, self.state = app, lane, state
        self.vllm = lane in ("priority", "standard")
        # Read once the engine is stopped: a vLLM lane's replica still answers (the fast and exact
        # lanes' stats would ask the stopped processes).
        self.cancelled = app.lane_stats(lane)["cancelled"] if self.vllm else None

    def reached_engine(self, timeout_s: float = 60) -> None:
        """Wait until a cancel or disconnect since the pause has reached the stopped engine: the fast
        lane's head or the exact lane's replica have it on their TCP links (``Paused.reached``); a
        vLLM lane's replica counted the stream cancelled, having handed vLLM's engine the abort."""
        if not self.vllm:
            return self.state.reached(timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.app.lane_stats(self.lane)["cancelled"] <= self.cancelled:
            assert time.monotonic() < deadline, f"the cancel did not reach the {self.lane} lane's engine"
            time.sleep(0.05)


class App:
    """A ``fastmode up`` process and an HTTP client for it. ``ca_file``: the app serves TLS with a
    certificate this file trusts (https, wss)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, ca_file: Path | None = None,
                 probe_first_requests: bool = False) -> None:
        self.port = free_port()
        http, ws = ("https", "wss") if ca_file else ("http", "ws")
        self.base = f"{http}://127.0.0.1:{self.port}"
        self.ws_url = f"{ws}://127.0.0.1:{self.port}/v1/responses"
        self.key = API_KEY
        self.ca_file = ca_file
        env = ({k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
               | USER_RAY_AUTH_MODE | {"FASTMODE_API_KEYS": f"{API_KEY},sk-other", "RAY_metrics_report_interval_ms": "1000"} | (env or {}))
        self.grpc_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{(metrics_port := free_port())}/metrics"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "up", "--port", str(self.port),
                                      "--grpc-port", str(self.grpc_port), "--metrics-port", str(metrics_port), *args],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self.client = httpx.Client(base_url=self.base, timeout=120, verify=str(ca_file) if ca_file else True,
                                   headers={"Authorization": f"Bearer {API_KEY}"})
        self.health_before_ready: list[tuple[int | None, dict | None]] = []  # (status, body) while loading
        self.models_before_ready: list[int] = []  # /v1/models' status while loading (once /health answered)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready.is_set():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGTERM)
                raise RuntimeError("fastmode up did not become ready:\n" + "".join(self.output[-60:]))
            try:
                r = self.client.get("/health", timeout=15)
                polled = (r.status_code, r.json() if r.headers.get("content-type") == "application/json" else None)
            except httpx.HTTPError:
                polled = (None, None)  # nothing listening yet
            if not self.ready.is_set():
                self.health_before_ready.append(polled)
                if polled[0] is not None:
                    self.models_before_ready.append(self.client.get("/v1/models", timeout=15).status_code)
            time.sleep(1)
        self.first_requests: dict[str, float] = {}
        """Seconds to each lane's first token, one request per lane in turn on one WebSocket, sent
        right after ``fastmode up`` said ready (``probe_first_requests``)."""
        if probe_first_requests:
            self.first_requests = self._first_requests()

    def _first_requests(self) -> dict[str, float]:
        from websockets.sync.client import connect

        took = {}
        with connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self.key}"}) as ws:
            for lane, body in FIRST_REQUESTS.items():
                started = time.perf_counter()
                ws.send(json.dumps({"type": "response.create", "id": lane, "max_output_tokens": 8,
                                    "temperature": 0, "input": "class Config:\n    def __init__(self", **body}))
                while True:
                    event = json.loads(ws.recv(timeout=120))
                    if event["type"] == "response.output_text.delta" and lane not in took:
                        took[lane] = time.perf_counter() - started
                    if event["type"] in ("response.completed", "error"):
                        assert event["type"] == "response.completed", event
                        break
        return took

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("fastmode up: ready"):
                self.ready.set()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def health(self) -> tuple[int, dict]:
        r = self.client.get("/health")
        return r.status_code, r.json()

    def lane_stats(self, lane: str) -> dict:
        return self.health()[1]["lanes"][lane]

    def engine_processes(self, lane: str) -> list[psutil.Process]:
        """The processes that compute ``lane``'s tokens: the fast lane's chips, the exact lane's replica
        (fastmode's engine runs in a thread of it), a vLLM lane's engine core (and its workers)."""
        root = psutil.Process(self.proc.pid)
        if lane == "fast":
            found = chip_processes(root)
        else:
            # Ray titles a replica ``ray::ServeReplica:<app>:<deployment>``, and while it runs a method
            # ``ray::ServeReplica:<app>:<deployment>.<method>``: match the deployment either way.
            replica = re.compile(rf"ray::ServeReplica:[^:]+:{lane}-lane(\.|\s|$)")
            replicas = [p for p in root.children(recursive=True) if replica.match(title(p))]
            found = replicas if lane == "exact" else [
                c for r in replicas for c in r.children(recursive=True) if title(c).startswith("VLLM")]
        assert found, f"no engine process of the {lane} lane among {[title(p) for p in root.children(recursive=True)]}"
        return found

    @contextmanager
    def paused(self, lane: str):
        """``lane``'s engine stopped for the block (``tests.pause``), yielding a ``PausedLane``. While
        the fast or the exact lane is paused, ``/health`` waits for it: ask it after the block."""
        with paused(self.engine_processes(lane)) as state:
            yield PausedLane(self, lane, state)

    def generate(self, **body) -> tuple[int, list[dict]]:
        """POST /v1/generate; the HTTP status and every event (one JSON object if refused)."""
        with self.stream(**body) as (status, events):
            return status, list(events)

    @contextmanager
    def stream(self, **body):
        """``(status, iterator of events)`` of a streaming request; leaving closes the connection."""
        with self.client.stream("POST", "/v1/generate", json=body) as r:
            if r.status_code != 200:
                r.read()
                yield r.status_code, iter([r.json()])
            else:
                yield 200, (json.loads(line) for line in r.iter_lines() if line)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 120) -> int:
        """Signal the process, wait for it to exit, return its exit code."""
        if self.running:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        return self.proc.returncode


@contextmanager
def app_with_config(yaml_text: str, tmp_dir: Path, *args: str, env: dict[str, str] | None = None,
                    ca_file: Path | None = None):
    """A ``fastmode up`` of its own, on the deployment YAML ``yaml_text`` (written to ``tmp_dir``),
    stopped on leaving."""
    from tests.conftest import with_test_pair

    config = tmp_dir / "app.yaml"
    config.write_text(with_test_pair(yaml_text))
    app = App("--config", str(config), *args, env=env, ca_file=ca_file)
    try:
        yield app
    finally:
        app.stop()


def self_signed(out: Path, name: str = "server") -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` and 127.0.0.1 and its key, as PEM files in ``out``
    (the certificate is its own CA: trust it with ``ca_file``)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = out / f"{name}.crt", out / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def text_of(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An in-process OTLP/gRPC trace receiver: every span exported to it, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, object]] = []  # (resource attributes, span)

    def Export(self, request, context):
        for rs in request.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                self.spans += [(resource, s) for s in ss.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


class SecureApp:
    """The app ``test_security.py`` and ``test_telemetry.py`` share (one ``fastmode up`` instead of two,
    about 100 s of CI): TLS on the gateway's own server and on gRPC (``cert``), ``cpus: auto``, the fast
    lane at tp=2 x pp=2 on 4 chips (so a step has chip-to-chip hops), spans exported over OTLP/gRPC to
    ``receiver`` and appended to ``spans`` (``FASTMODE_TRACE_FILE``), Ray's files under ``ray_tmp``."""

    def __init__(self, tmp_dir: Path) -> None:
        import tempfile
        from concurrent import futures

        import grpc

        self.receiver = TraceReceiver()
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.receiver, self._server)
        otlp_port = free_port()
        self._server.add_insecure_port(f"127.0.0.1:{otlp_port}")
        self._server.start()
        self.cert, key = self_signed(tmp_dir)
        self.spans = tmp_dir / "spans.jsonl"
        # Its own Ray temp dir (short: Ray's socket paths live under it), so its session's logs are all here.
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="fmsec", dir="/tmp"))
        env = {"FASTMODE_TRACE_FILE": str(self.spans), "OTEL_BSP_SCHEDULE_DELAY": "200", "RAY_TMPDIR": str(self.ray_tmp),
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        config = (f"http: {{server: gateway, tls_certfile: {self.cert}, tls_keyfile: {key}}}\n"
                  f"grpc: {{tls_certfile: {self.cert}, tls_keyfile: {key}}}\n"
                  "cpus: auto\n" + eager_lanes("tp: 2, pp: 2"))
        self._cm = app_with_config(config, tmp_dir, "--chips", "4", env=env, ca_file=self.cert)
        try:
            self.app = self._cm.__enter__()
        except BaseException:
            self._server.stop(0)
            raise
        self.app.seen = []  # every output text test_security sent for, to look for afterwards

    def ssl_context(self):
        import ssl

        return ssl.create_default_context(cafile=str(self.cert))

    def stop(self) -> None:
        import shutil

        if self._cm is not None:
            cm, self._cm = self._cm, None
            try:
                cm.__exit__(None, None, None)
            finally:
                self._server.stop(0)
                shutil.rmtree(self.ray_tmp, ignore_errors=True)


_secure: dict[str, SecureApp] = {}


@pytest.fixture(scope="session")
def secure_app(tmp_path_factory) -> SecureApp:
    """``SecureApp``, started on first use. Its users run one after the other (``tests/conftest.py``
    orders them) and it stops after the last of them (``pytest_runtest_teardown`` below), not at the
    end of the session, so that it never runs beside the apps of later tests."""
    if "app" not in _secure:
        _secure["app"] = SecureApp(tmp_path_factory.mktemp("secure"))
    yield _secure["app"]
    stop_secure_app()


def stop_secure_app() -> None:
    if "app" in _secure:
        _secure.pop("app").stop()


def pytest_runtest_teardown(item, nextitem):
    if "secure_app" in item.fixturenames and (nextitem is None or "secure_app" not in nextitem.fixturenames):
        stop_secure_app()
