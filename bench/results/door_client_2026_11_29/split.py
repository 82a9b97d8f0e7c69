"""Throwaway (2026-11-29). Client TTFT vs the head's own (response.completed timing.ttft_s) on a door URL, blocking client."""
import json, statistics, sys, time
sys.path.insert(0, "/work/main")
from bench.ws_blocking import BlockingWebSocket
from bench.gateway import blocking_response, door_url
url = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
ws = door_url(url, None) if url.startswith("http") else url
with BlockingWebSocket(ws) as conn:
    for i in range(5): blocking_response(conn, f"w{i}", "fastmode-fast", None, 4)
    c, h = [], []
    for i in range(n):
        first, total, done = blocking_response(conn, f"t{i}", "fastmode-fast", None, 4)
        c.append(first * 1e3); h.append(done["timing"]["ttft_s"] * 1e3)
print(f"client p50 {statistics.median(c):.3f} ms; head ttft p50 {statistics.median(h):.3f} ms; outside the head {statistics.median([a-b for a,b in zip(c,h)]):.3f} ms")
