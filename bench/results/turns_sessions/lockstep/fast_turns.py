"""Throwaway: the fast ring's first token for 12 new tokens after a cached history of H tokens,
against a fresh prompt of the same 12+1 tokens; the head's step compute split out."""
import asyncio, random, statistics, sys, time, json
from bench.lanes_quick import fast_ring

HIST = [0, 16, 48, 112, 240, 368]
NEW = 12

async def measure(ring, rounds, gap):
    from serve.lanes.engine import EngineRequest
    from serve.lanes.head_client import HeadClient
    m = ring.model
    seen = []
    class Rec(HeadClient):
        def _deliver(self, outputs, infos, report):
            seen.append((time.time_ns(), infos))
            super()._deliver(outputs, infos, report)
    c = Rec(m.config, m.max_len, m.client_address, m.secret, m.tokenizer, {})
    await c.connect()
    rng = random.Random(0)
    n = 0
    async def once(ids, tokens):
        nonlocal n
        n += 1
        seen.clear()
        t0, t0ns, first, cached = time.perf_counter(), time.time_ns(), None, None
        async for out in c.generate(EngineRequest(f"r{n}", ids, tokens, temperature=0, ignore_eos=True)):
            if first is None:
                first, cached = time.perf_counter() - t0, out.cached_tokens
        got, infos = seen[0]
        step = infos[0]
        return 1e3 * first, 1e3 * step.stage_seconds[0], cached, (step.start_ns - t0ns) / 1e6, (step.end_ns - step.start_ns) / 1e6, (got - step.end_ns) / 1e6
    res = {h: [] for h in range(20)}
    for r in range(rounds + 1):
        conv = []
        for t in range(20):
            conv = conv + [rng.randrange(300, 3000) for _ in range(NEW)]
            time.sleep(gap)
            seen.clear()
            t0, t0ns, first, cached, toks = time.perf_counter(), time.time_ns(), None, None, []
            n += 1
            async for out in c.generate(EngineRequest(f"r{n}", conv, 8, temperature=0, ignore_eos=True)):
                if first is None:
                    first, cached = time.perf_counter() - t0, out.cached_tokens
                    got, infos = seen[0]; step = infos[0]
                toks += out.token_ids
            conv = conv + toks
            if r >= 1:
                res[t].append((1e3 * first, 1e3 * step.stage_seconds[0], cached, (step.start_ns - t0ns) / 1e6, (step.end_ns - step.start_ns) / 1e6, (got - step.end_ns) / 1e6))
    c.close()
    return res

if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    gap = float(sys.argv[2]) / 1e3 if len(sys.argv) > 2 else 0.001
    with fast_ring() as ring:
        print(ring.layout, ring.options)
        res = asyncio.run(measure(ring, rounds, gap))
    out = {}
    for h, xs in res.items():
        cols = [statistics.median(c) for c in zip(*xs)]
        out[h] = cols
        print(f"turn {h+1:4d}: first {cols[0]:.3f} compute {cols[1]:.3f} cached {cols[2]} send->step {cols[3]:.3f} step {cols[4]:.3f} end->client {cols[5]:.3f}")
    json.dump({str(k): v for k, v in out.items()}, open("/dev/null", "w"))
