"""Does work on the serving CPU slow the engine on the compute CPU? vLLM in process, 32 streams,
alternated: nothing on CPU 1 beyond the driver / a spinner at 50% / at 100% duty on CPU 1."""
import asyncio, os, statistics, sys, time, multiprocessing as mp
sys.path.insert(0, "/work/main")
from unittest.mock import patch
from cluster import cpus

def spin(duty, stop):
    os.sched_setaffinity(0, {1})
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < duty * 0.01: pass
        time.sleep((1 - duty) * 0.01)

async def main():
    from models import FULL
    from serve.config import StandardLaneConfig
    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine
    engine = VLLMLaneEngine(FULL, StandardLaneConfig())
    async def one(rid):
        n = 0
        async for o in engine.generate(EngineRequest(rid, [0, 100, 200], 256, temperature=0, ignore_eos=True)):
            n += len(o.token_ids)
        return n
    async def agg(r):
        t = time.perf_counter(); tot = sum(await asyncio.gather(*(one(f"c{r}-{i}") for i in range(32))))
        return tot / (time.perf_counter() - t)
    await agg(-1)
    res = {0: [], 0.5: [], 1.0: []}
    for r in range(4):
        for duty in ([0, 0.5, 1.0] if r % 2 == 0 else [1.0, 0.5, 0]):
            stop = mp.Event(); p = None
            if duty:
                p = mp.Process(target=spin, args=(duty, stop)); p.start(); time.sleep(0.2)
            res[duty].append(await agg(f"{r}{duty}"))
            if p: stop.set(); p.join()
        print(r, {k: round(v[-1]) for k, v in res.items()}, flush=True)
    for k, v in res.items():
        print(f"duty {k}: median {statistics.median(v):.0f} tok/s  ratio to idle {statistics.median(v)/statistics.median(res[0]):.3f}")
    engine.shutdown()

if __name__ == "__main__":
    with patch.dict(os.environ, {cpus.ENV: "auto"}), cpus.placed("serving"):
        asyncio.run(main())
