"""Prometheus metrics of the lanes and the hops, through Ray's own metrics pipeline.

Defined with ``ray.util.metrics`` like Ray Serve's own, so they are scraped from the same per-node
endpoint (``ray.init(_metrics_export_port=...)``; ``fastmode up --metrics-port``, default 8080)
next to ``ray_serve_*``; Ray prefixes every name with ``ray_``. docs/observability.md lists them.

- ``ray_fastmode_requests_total{lane, outcome}``: every request the router saw; outcome
  ``completed``, ``cancelled`` or the error code (``overloaded``, ``invalid_request``, ...); lane
  ``none`` when refused before a lane was chosen.
- ``ray_fastmode_ttft_seconds{lane}``, ``ray_fastmode_tpot_seconds{lane}`` (time per output token
  after the first), ``ray_fastmode_queue_seconds{lane}`` (arrival at the engine to its first step).
- ``ray_fastmode_batch_size{lane}``: sequences per engine step (fast lane: every step; vLLM lanes:
  the engine's sequences when a request gets its first token).
- ``ray_fastmode_hop_seconds{src_chip, dst_chip, transport}`` and ``ray_fastmode_hop_bytes{...}``:
  every hop of every ``HOP_EVERY``-th fast-lane step.
- ``ray_fastmode_spec_acceptance_rate{lane}`` (drafts accepted per draft, per request) and
  ``ray_fastmode_spec_tokens_per_step{lane}`` (tokens per verify step, per request): the exact lane's
  speculative decoding; ``ray_fastmode_spec_draft_tokens_total{lane, outcome}`` counts drafts
  ``accepted`` and ``rejected``.
"""

from __future__ import annotations

import functools

HOP_EVERY = 4
"""Hop metrics sample one step in this many (each hop is two observations)."""

_LATENCY = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
_HOP = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5]
_BYTES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216]
_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256]
_RATE = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
_PER_STEP = [1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 12, 17]


@functools.cache
def _metrics():
    from ray.util.metrics import Counter, Histogram

    lane = ("lane",)
    hop = ("src_chip", "dst_chip", "transport")
    return {
        "requests": Counter("fastmode_requests_total", "Requests by lane and outcome.", tag_keys=("lane", "outcome")),
        "ttft": Histogram("fastmode_ttft_seconds", "Time to first token at the lane.", _LATENCY, lane),
        "tpot": Histogram("fastmode_tpot_seconds", "Time per output token after the first.", _LATENCY, lane),
        "queue": Histogram("fastmode_queue_seconds", "Arrival at the engine to its first step.", _LATENCY, lane),
        "batch": Histogram("fastmode_batch_size", "Sequences per engine step.", _BATCH, lane),
        "hop_seconds": Histogram("fastmode_hop_seconds", "Chip-to-chip hop duration.", _HOP, hop),
        "hop_bytes": Histogram("fastmode_hop_bytes", "Chip-to-chip hop payload.", _BYTES, hop),
        "spec_rate": Histogram("fastmode_spec_acceptance_rate", "Drafts accepted per draft, per request.",
                               _RATE, lane),
        "spec_per_step": Histogram("fastmode_spec_tokens_per_step", "Tokens per verify step, per request.",
                                   _PER_STEP, lane),
        "spec_drafts": Counter("fastmode_spec_draft_tokens_total", "Draft tokens by outcome.",
                               tag_keys=("lane", "outcome")),
    }


def request(lane: str | None, outcome: str) -> None:
    _metrics()["requests"].inc(tags={"lane": lane or "none", "outcome": outcome})


def latency(lane: str, *, ttft: float | None = None, tpot: float | None = None, queue: float | None = None) -> None:
    m, tags = _metrics(), {"lane": lane}
    for name, value in (("ttft", ttft), ("tpot", tpot), ("queue", queue)):
        if value is not None:
            m[name].observe(max(0.0, value), tags=tags)


def batch_size(lane: str, n: int) -> None:
    _metrics()["batch"].observe(n, tags={"lane": lane})


def hops(hop_list) -> None:
    m = _metrics()
    for h in hop_list:
        tags = {"src_chip": h.src_chip, "dst_chip": h.dst_chip, "transport": h.transport}
        m["hop_seconds"].observe(h.seconds, tags=tags)
        m["hop_bytes"].observe(h.bytes, tags=tags)


def speculative(lane: str, spec: dict) -> None:
    """One request's speculative decoding (``EngineOutput.speculative``)."""
    m, tags = _metrics(), {"lane": lane}
    if spec["verify_steps"]:
        m["spec_rate"].observe(spec["acceptance_rate"], tags=tags)
        m["spec_per_step"].observe(spec["tokens_per_step"], tags=tags)
    if spec["accepted"]:
        m["spec_drafts"].inc(spec["accepted"], tags={"lane": lane, "outcome": "accepted"})
    if spec["drafted"] - spec["accepted"]:
        m["spec_drafts"].inc(spec["drafted"] - spec["accepted"], tags={"lane": lane, "outcome": "rejected"})
