"""Standard lane's vLLM engine in process: first token of 12 new tokens after a cached history of
H tokens, alone and with 3 other streams decoding (context ~200, continuously)."""
import asyncio, sys, random, statistics, time
sys.path.insert(0, ".")  # run from the repository root
from bench.prefill_cost import _engine, _first_token

async def main():
    eng = _engine(sys.argv[1] if len(sys.argv) > 1 else "standard")
    rng = random.Random(3)
    stop = asyncio.Event()
    from serve.lanes.engine import EngineRequest

    async def background(i):
        n = 0
        while not stop.is_set():
            ids = [rng.randrange(300, 3000) for _ in range(rng.randrange(50, 400))]
            async for _ in eng.generate(EngineRequest(f"bg{i}-{n}", ids, 8, temperature=0.0, ignore_eos=True)):
                pass
            n += 1
    res = {}
    try:
        for phase in ("alone", "load", "alone2", "load2"):
            tasks = [asyncio.ensure_future(background(i)) for i in range(3)] if phase.startswith("load") else []
            await asyncio.sleep(0.5)
            for r in range(8):
                for H in (50, 400):
                    hist = [rng.randrange(300, 3000) for _ in range(H + 1)]
                    await _first_token(eng, f"h{phase}{r}{H}", hist, 1)
                    ids = hist + [rng.randrange(300, 3000) for _ in range(12)]
                    t, cached, _ = await _first_token(eng, f"t{phase}{r}{H}", ids, 2)
                    if r >= 2:
                        res.setdefault((phase.rstrip("2"), H), []).append(t)
            stop.set()
            for t in tasks:
                await t
            stop.clear()
        for (ph, H), v in sorted(res.items()):
            print(ph, H, round(statistics.median(v), 2), len(v))
        for ph in ("alone", "load"):
            print(ph, "ratio 400/50", round(statistics.median(res[(ph, 400)]) / statistics.median(res[(ph, 50)]), 2))
    finally:
        eng.shutdown()
if __name__ == "__main__":
    asyncio.run(main())
