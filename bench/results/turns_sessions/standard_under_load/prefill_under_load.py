"""vLLM standard engine in process: first token of fresh prompts of 13 and 29 tokens, alone and
with 3 other streams decoding (contexts 50-400)."""
import asyncio, sys, random, statistics
sys.path.insert(0, ".")  # run from the repository root
from bench.prefill_cost import _engine, _first_token

async def main():
    eng = _engine("standard")
    rng = random.Random(5)
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
            for r in range(10):
                for n in (13, 29):
                    ids = [rng.randrange(300, 3000) for _ in range(n)]
                    t, cached, _ = await _first_token(eng, f"t{phase}{r}{n}", ids, 2)
                    if r >= 2:
                        res.setdefault((phase.rstrip("2"), n), []).append(t)
            stop.set()
            for t in tasks:
                await t
            stop.clear()
        for (ph, n), v in sorted(res.items()):
            print(ph, n, round(statistics.median(v), 2), len(v))
        for ph in ("alone", "load"):
            print(ph, "ratio 29/13", round(statistics.median(res[(ph, 29)]) / statistics.median(res[(ph, 13)]), 2))
    finally:
        eng.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
