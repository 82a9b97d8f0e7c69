"""``fastmode chat`` as a subprocess against the running application."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.soak import cancelled
from tests.serve.conftest import REPO, text_of


def chat(a, *args: str, key: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clients.cli", "chat", *args, "--url", a.base,
                           "--api-key", key or a.key], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_usage_errors_exit_2():
    p = subprocess.run([sys.executable, "-m", "clients.cli", "chat"], cwd=REPO, capture_output=True,
                       text=True)
    assert p.returncode == 2 and "prompt" in p.stderr
    p = subprocess.run([sys.executable, "-m", "clients.cli", "chat", "x", "--max-tokens", "many"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([sys.executable, "-m", "clients.cli", "chat", "x", "--ca-file", "ca.pem"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--ca-file is for a wss:// (or https://) server" in p.stderr


def test_nothing_listening_exits_1_with_the_code():
    from tests.serve.conftest import free_port

    p = subprocess.run([sys.executable, "-m", "clients.cli", "chat", "x", "--url", f"ws://127.0.0.1:{free_port()}"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.startswith("fastmode chat: connection_failed: "), p.stderr
    assert p.stdout == ""


@pytest.mark.slow
def test_json_prints_the_complete_response(app):
    a = app()
    p = chat(a, "def main():\n", "--model", "fastmode-fast", "--max-tokens", "16", "--temperature", "0",
             "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)  # one JSON object and nothing else
    _, ref = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=16, temperature=0)
    assert r["text"] == text_of(ref) and r["lane"] == "fast" and r["model"] == "fastmode-fast"
    assert r["usage"]["output_tokens"] == 16 and r["timing"]["ttft_s"] > 0 and r["cost_units"] > 0
    assert r["finish_reason"] == "length" and r["id"]


@pytest.mark.slow
def test_door_streams_from_the_fast_lanes_door(app):
    a = app()
    p = chat(a, "def main():\n", "--door", "--max-tokens", "16", "--temperature", "0", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    _, ref = a.generate(model="fastmode-fast", input="def main():\n", max_output_tokens=16, temperature=0)
    assert r["text"] == text_of(ref) and r["lane"] == "fast" and r["usage"]["output_tokens"] == 16
    for wrong in (["--model", "fastmode-full"], ["-i"]):
        p = chat(a, "x", "--door", *wrong)
        assert p.returncode == 2 and "--door serves fastmode-fast" in p.stderr


@pytest.mark.slow
def test_plain_mode_streams_text_then_a_stats_line(app):
    a = app()
    p = chat(a, "def main():\n", "--service-tier", "priority", "--max-tokens", "12", "--temperature", "0")
    assert p.returncode == 0, p.stderr
    _, ref = a.generate(model="fastmode-full", service_tier="priority", input="def main():\n",
                        max_output_tokens=12, temperature=0)
    assert p.stdout.rstrip("\n") == text_of(ref).rstrip("\n")
    line = p.stderr.strip()
    assert line.startswith("lane priority · model fastmode-full · 12 tokens · ttft "), line
    assert " ms · " in line and " tok/s · " in line and line.endswith(" cost units")


@pytest.mark.slow
def test_errors_exit_1_with_the_code(app):
    a = app()
    p = chat(a, "x", "--model", "nope")
    assert p.returncode == 1 and p.stderr.startswith("fastmode chat: unknown_model: "), p.stderr
    p = chat(a, "x", "--model", "fastmode-fast", key="sk-wrong")
    assert p.returncode == 1 and p.stderr.startswith("fastmode chat: unauthorized: "), p.stderr


@pytest.mark.slow
def test_ctrl_c_cancels_the_response_and_exits_130(app):
    import signal
    import time

    a = app()
    before = cancelled(a.lane_stats("fast"))
    p = subprocess.Popen([sys.executable, "-m", "clients.cli", "chat", "def main():\n", "--model",
                          "fastmode-fast", "--max-tokens", "400", "--url", a.base, "--api-key", a.key],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.read(1)  # streaming has begun
    with a.paused("fast") as fast:  # the stream cannot end before the cancel reaches the head
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        fast.reached_engine()
    assert p.returncode == 130, err
    deadline = time.monotonic() + 30
    while (s := a.lane_stats("fast"))["running"] or s["in_flight"]:
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
    assert cancelled(s) == before + 1, s


@pytest.mark.slow
def test_interactive_mode_continues_the_conversation_turn_by_turn(app):
    a = app()
    lines = ["def parse(line):", "def total(rows):", "import os"]
    p = subprocess.run([sys.executable, "-m", "clients.cli", "chat", "-i", "--model", "fastmode-fast", "--max-tokens",
                        "6", "--temperature", "0", "--json", "--url", a.base, "--api-key", a.key],
                       input="\n".join(lines) + "\n\n", cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    turns = [json.loads(line) for line in p.stdout.splitlines()]
    assert len(turns) == 3
    conversation = []
    for line, r in zip(lines, turns, strict=True):  # each turn is what re-sending the conversation gives
        conversation.append({"role": "user", "content": line})
        _, ref = a.generate(model="fastmode-fast", input=list(conversation), max_output_tokens=6, temperature=0)
        assert r["text"] == text_of(ref)
        conversation.append({"role": "assistant", "content": r["text"]})
    assert all(t["usage"]["cached_tokens"] > 0 for t in turns[1:]), [t["usage"] for t in turns]
