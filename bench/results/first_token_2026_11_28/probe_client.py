"""Throwaway (2026-11-28): 200 warm fast-lane requests of 4 tokens on one WebSocket; writes each one's
send, response.created and first delta (CLOCK_MONOTONIC ns) to /tmp/probe_client.txt."""
import asyncio, json, time, sys
from websockets.asyncio.client import connect
sys.path.insert(0, ".")  # run from the repository root, against fastmode up --port 18000
from bench.gateway import _create, _responses_ws, LANES

async def main():
    ws_url, headers = _responses_ws("http://127.0.0.1:18000", None)
    model, tier = LANES["fast"]
    out = []
    async with connect(ws_url, additional_headers=headers) as conn:
        for i in range(int(sys.argv[1])):
            t0 = time.monotonic_ns()
            await conn.send(_create(f"p{i}", model, tier, 4))
            first = None
            while True:
                e = json.loads(await conn.recv())
                if e["type"] == "response.created":
                    tc = time.monotonic_ns()
                if e["type"] == "response.output_text.delta" and first is None:
                    first = time.monotonic_ns()
                if e["type"] == "response.completed":
                    break
            out.append((t0, tc, first))
    with open("/tmp/probe_client.txt", "w") as f:
        for r in out:
            f.write(" ".join(map(str, r)) + "\n")

if __name__ == "__main__":
    asyncio.run(main())
