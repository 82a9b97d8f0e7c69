"""Throwaway: uvicorn's two websockets implementations, an echo-ish app (the request frame in, one
JSON frame out), round-trip time from a client in another process; alternated blocks."""
import asyncio, json, multiprocessing as mp, statistics, sys, time

def serve(ws_impl, port):
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    async def ep(ws):
        await ws.accept()
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            ev = json.loads(msg["text"])
            await ws.send_text(json.dumps({"type": "response.created", "id": ev["id"]}))
            await ws.send_text(json.dumps({"type": "response.output_text.delta", "id": ev["id"], "delta": "x"}))
    app = Starlette(routes=[WebSocketRoute("/ws", ep)])
    import uvloop
    uvloop.install()
    uvicorn.run(app, host="127.0.0.1", port=port, ws=ws_impl, log_level="warning", ws_per_message_deflate=False)

async def client(port, n):
    from websockets.asyncio.client import connect
    out = []
    async with connect(f"ws://127.0.0.1:{port}/ws") as c:
        for i in range(n + 20):
            t = time.perf_counter()
            await c.send(json.dumps({"type": "response.create", "id": f"r{i}", "input": "hello"}))
            await c.recv(); await c.recv()
            out.append(time.perf_counter() - t)
    return out[20:]

if __name__ == "__main__":
    impls = {"websockets": 18101, "websockets-sansio": 18102}
    procs = [mp.Process(target=serve, args=(k, p), daemon=True) for k, p in impls.items()]
    for p in procs: p.start()
    time.sleep(4)
    res = {k: [] for k in impls}
    order = list(impls)
    for r in range(8):
        for k in (order if r % 2 == 0 else order[::-1]):
            res[k] += asyncio.run(client(impls[k], 200))
    for k, xs in res.items():
        print(k, f"p50 {1e6*statistics.median(xs):.0f} us", f"p10 {1e6*sorted(xs)[len(xs)//10]:.0f}", f"p90 {1e6*sorted(xs)[9*len(xs)//10]:.0f}", len(xs))
    for p in procs: p.terminate()
