"""Warm first token on the door / gateway: the asyncio websockets client (bench's) vs websockets' sync client, alternated."""
import asyncio, json, statistics, sys, time
sys.path.insert(0, "/work/main")
from websockets.sync.client import connect as sconnect
from bench.gateway import warm_ttft, door_url, _create, LANES
url = "http://127.0.0.1:18000"
model, tier = LANES["fast"]
def sync_ttft(ws_url, n):
    with sconnect(ws_url) as c:
        out = []
        for i in range(n + 1):
            t = time.perf_counter(); c.send(_create(f"s{i}", model, tier, 4)); first = None
            while True:
                e = json.loads(c.recv())
                if e["type"] == "response.output_text.delta" and first is None: first = time.perf_counter() - t
                elif e["type"] == "response.completed": break
            if i: out.append(first)
        return out
d = door_url(url, None); g = "ws://127.0.0.1:18000/v1/responses"
res = {k: [] for k in ("door async", "door sync", "gw async", "gw sync")}
for r in range(6):
    order = [("door async", lambda: asyncio.run(warm_ttft(url, None, 10, door=True))), ("door sync", lambda: sync_ttft(d, 10)),
             ("gw async", lambda: asyncio.run(warm_ttft(url, None, 10))), ("gw sync", lambda: sync_ttft(g, 10))]
    for k, f in (order if r % 2 == 0 else order[::-1]):
        res[k] += f()
for k, v in res.items(): print(f"{k:10s} p50 {statistics.median(v)*1e3:.3f} ms")
