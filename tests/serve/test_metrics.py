"""Prometheus metrics of the lanes and hops, scraped from the running application's Ray endpoint."""

from __future__ import annotations

import re
import time

import httpx
import pytest


def scrape(url: str) -> dict[str, float]:
    """``name{selected labels}`` -> value, summed over the labels Ray adds (worker, session, ...)."""
    keep = ("lane", "outcome", "src_chip", "dst_chip", "transport", "le")
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        m = re.match(r"^(ray_fastmode_\w+)\{(.*)\} (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        key = m.group(1) + "{" + ",".join(f"{k}={labels[k]}" for k in keep if k in labels) + "}"
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


@pytest.mark.slow
def test_lane_metrics_are_exported(app):
    a = app()
    for model, tier in (("fastmode-fast", None), ("fastmode-full", "priority"), ("fastmode-full", None),
                        ("fastmode-full", "exact")):
        status, _ = a.generate(model=model, service_tier=tier, input="def main():\n", max_output_tokens=16,
                               temperature=0)  # greedy: a sampled exact request runs on priority
        assert status == 200
    assert a.generate(model="nope", input="x")[0] == 404
    deadline = time.monotonic() + 60
    while True:
        m = scrape(a.metrics_url)
        want = [f"ray_fastmode_{name}_count{{lane={lane}}}" for name in ("ttft_seconds", "tpot_seconds", "queue_seconds",
                                                                        "batch_size")
                for lane in ("fast", "priority", "standard", "exact")]
        want += [f"ray_fastmode_spec_{name}_count{{lane=exact}}" for name in ("acceptance_rate", "tokens_per_step")]
        want += ["ray_fastmode_spec_draft_tokens_total{lane=exact,outcome=accepted}",
                 "ray_fastmode_requests_total{lane=fast,outcome=completed}",
                 "ray_fastmode_requests_total{lane=none,outcome=unknown_model}"]
        if all(m.get(k, 0) > 0 for k in want):
            break
        assert time.monotonic() < deadline, sorted(k for k in m if k.endswith("}") and "_bucket" not in k)
        time.sleep(1)
    assert m["ray_fastmode_ttft_seconds_sum{lane=fast}"] > 0
    # Buckets are cumulative: the +Inf bucket holds every observation.
    assert m["ray_fastmode_ttft_seconds_bucket{lane=fast,le=+Inf}"] == m["ray_fastmode_ttft_seconds_count{lane=fast}"]


def hop_pairs(metrics_url: str, want: int, timeout_s: float = 60) -> dict[str, float]:
    """The ``ray_fastmode_hop_seconds_count`` series once ``want`` chip pairs have reported."""
    deadline = time.monotonic() + timeout_s
    while True:
        hops = {k: v for k, v in scrape(metrics_url).items() if k.startswith("ray_fastmode_hop_seconds_count")}
        if len(hops) >= want:
            return hops
        assert time.monotonic() < deadline, sorted(hops)
        time.sleep(1)
