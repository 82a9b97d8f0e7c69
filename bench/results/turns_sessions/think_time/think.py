"""bench.turns' websocket way with a pause of THINK ms before every turn's send (an agent's tool time)."""
import asyncio, json, sys, time, statistics
sys.path.insert(0, ".")  # run from the repository root
import bench.turns as bt

THINK = float(sys.argv[1]) / 1e3
LANES = sys.argv[2].split(",")

async def ws_think(url, key, lane, inputs, tokens, on_turn=None):
    from websockets.asyncio.client import connect
    turns, previous = [], None
    async with connect("ws" + url[4:] + "/v1/responses", max_size=None) as ws:
        for k, text in enumerate(inputs):
            await asyncio.sleep(THINK)
            rid = f"turn-{lane}-{id(inputs)}-{k}-{time.monotonic_ns()}"
            body = {"type": "response.create", "id": rid, **bt.LANE_PARAMS[lane], "input": text, "temperature": 0,
                    "max_output_tokens": tokens, "ignore_eos": True}
            if previous:
                body["previous_response_id"] = previous
            sent, first = time.perf_counter(), None
            await ws.send(json.dumps(body))
            while True:
                e = json.loads(await ws.recv())
                if e["type"] == "response.output_text.delta" and first is None:
                    first = time.perf_counter()
                elif e["type"] == "error":
                    raise RuntimeError(e)
                elif e["type"] == "response.completed":
                    turns.append({"ttft_s": first - sent, "total_s": 0, "input_tokens": e["usage"]["input_tokens"],
                                  "cached_tokens": e["usage"]["input_tokens_details"]["cached_tokens"]})
                    break
            previous = rid
            if on_turn:
                on_turn(k + 1)
    return turns

bt.ws_conversation = ws_think
bt.http_conversation = ws_think
out = asyncio.run(bt.measure("http://127.0.0.1:18000", None, LANES, 4, 20, 8, 1))
for lane, r in out.items():
    for way in ("websocket", "http_resend"):
        t = r[way]["ttft_ms_per_turn"]
        print(f"think {THINK*1e3:g} ms {lane} {way}: t1 {t[0]:.1f} t20 {t[-1]:.1f} ratio {t[-1]/t[0]:.2f} "
              f"median t2-20 {statistics.median(t[1:]):.1f} / t1 = {statistics.median(t[1:])/t[0]:.2f}")
