import asyncio, os, statistics, sys, time
sys.path.insert(0, "/work/main")
from unittest.mock import patch
from cluster import cpus
async def main():
    from models import FULL
    from serve.config import StandardLaneConfig
    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(str(FULL / "tokenizer.json")).encode("class Parser:\n").ids
    engine = VLLMLaneEngine(FULL, StandardLaneConfig())
    async def one(rid, t0):
        n, first = 0, None
        async for o in engine.generate(EngineRequest(rid, ids, 256, temperature=0, ignore_eos=True)):
            n += len(o.token_ids); first = first or time.perf_counter() - t0
        return n, first
    for r in range(4):
        t = time.perf_counter()
        res = await asyncio.gather(*(one(f"c{r}-{i}", t) for i in range(32)))
        el = time.perf_counter() - t
        n = sum(x[0] for x in res)
        print(f"run {el:.2f} s {n/el:.0f} tok/s first p50 {statistics.median(x[1] for x in res)*1e3:.0f} ms", flush=True)
    engine.shutdown()
if __name__ == "__main__":
    with patch.dict(os.environ, {cpus.ENV: "auto"}), cpus.placed("serving"):
        asyncio.run(main())
