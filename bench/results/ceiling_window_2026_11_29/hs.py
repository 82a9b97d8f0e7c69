import asyncio, time, statistics, sys
sys.path.insert(0, "/work/main")
from websockets.asyncio.client import connect
from bench.gateway import ws_response, LANES
async def main():
    url = "ws://127.0.0.1:18000/v1/responses"
    model, tier = LANES["standard"]
    for rep in range(3):
        t = time.perf_counter()
        conns = await asyncio.gather(*(connect(url) for _ in range(32)))
        t_open = time.perf_counter() - t
        t = time.perf_counter()
        res = await asyncio.gather(*(ws_response(c, f"h{rep}-{i}", model, tier, 256) for i, c in enumerate(conns)))
        el = time.perf_counter() - t
        n = sum(r[2]["usage"]["output_tokens"] for r in res)
        print(f"open 32: {t_open*1e3:.0f} ms; run {el:.2f} s {n/el:.0f} tok/s; with open {n/(el+t_open):.0f}; first tok p50 {statistics.median(r[0] for r in res)*1e3:.0f} ms max {max(r[0] for r in res)*1e3:.0f} ms; input_tokens {res[0][2]['usage']['input_tokens']}", flush=True)
        await asyncio.gather(*(c.close() for c in conns))
asyncio.run(main())
