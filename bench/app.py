"""A ``fastmode up`` for a benchmark run: started in a subprocess on free ports with a fresh API key,
ready when it prints ``fastmode up: ready`` (and, unless told otherwise, once the exact lane runs
compiled: ``lanes.exact.compile_in_background``), stopped with Ctrl-C (SIGINT) on exit."""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from serve.up import COMPILING

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A free port below the kernel's ephemeral range, where Ray's own processes (which bind
    ephemeral ports while the app starts) cannot take it first."""
    while True:
        port = random.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@dataclass
class RunningApp:
    url: str
    """``http://127.0.0.1:PORT``; the WebSocket is ``ws://127.0.0.1:PORT``."""
    key: str
    start_s: float
    grpc: str | None = None
    """``127.0.0.1:PORT`` of its gRPC server."""
    compiled_s: float | None = None
    """Seconds from the start until the exact lane ran compiled, where it compiled in the background."""

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[4:]


class AppFailed(RuntimeError):
    """``fastmode up`` exited or was not ready in time; the message has its output's tail."""


@contextlib.contextmanager
def running_app(*args: str, timeout_s: float = 400, log: Path | None = None, compiled: bool = True,
                compile_timeout_s: float = 3600) -> Iterator[RunningApp]:
    """``compiled``: where the exact lane compiles in the background, wait (up to ``compile_timeout_s``
    more) until it runs compiled, so that it is measured as it serves from then on. A first compile
    on a small CPU can take tens of minutes (every attention span of the lane's context); later starts
    read inductor's cache."""
    port, grpc_port, key = free_port(), free_port(), "sk-bench-" + secrets.token_urlsafe(12)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"FASTMODE_API_KEYS": key}
    cmd = [sys.executable, "-m", "clients.cli", "up", "--port", str(port), "--grpc-port", str(grpc_port),
           "--metrics-port", str(free_port()), *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready, switched = threading.Event(), threading.Event()

    def read() -> None:
        with open(log, "w") if log else contextlib.nullcontext() as f:
            for line in proc.stdout:
                lines.append(line)
                if f:
                    f.write(line)
                    f.flush()
                if line.startswith("fastmode up: ready"):
                    ready.set()
                if line.startswith(("fastmode up: the exact lane runs compiled", "fastmode up: the exact lane's compile")):
                    switched.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.wait(1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AppFailed("fastmode up did not become ready:\n" + "".join(lines[-40:]))
        app = RunningApp(f"http://127.0.0.1:{port}", key, time.perf_counter() - t0, f"127.0.0.1:{grpc_port}")
        if compiled and COMPILING in "".join(lines):
            deadline = time.monotonic() + compile_timeout_s
            while not switched.wait(1):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AppFailed("the exact lane did not run compiled in time:\n" + "".join(lines[-40:]))
            if not any(line.startswith("fastmode up: the exact lane runs compiled") for line in lines):
                raise AppFailed("the exact lane's compile failed:\n" + "".join(lines[-40:]))
            app.compiled_s = time.perf_counter() - t0
        yield app
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
