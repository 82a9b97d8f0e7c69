"""Throwaway (2026-11-27 21:2x UTC, docs/serving.md "Multi-turn"): N concurrent conversations on the in-process fast ring through one HeadClient, each
turn 12 new tokens + 8 outputs, `think` ms before each turn; per turn: first token, send->step,
the prefill step, its batch size."""
import asyncio, random, statistics, sys, time
from bench.lanes_quick import fast_ring

async def measure(ring, n, convs_per_slot, think):
    from serve.lanes.engine import EngineRequest
    from serve.lanes.head_client import HeadClient
    m = ring.model
    class Rec(HeadClient):
        def _deliver(self, outputs, infos, report):
            now = time.time_ns()
            for rid, *_ in outputs:
                self.stamp.setdefault(rid, (now, infos))
            super()._deliver(outputs, infos, report)
    c = Rec(m.config, m.max_len, m.client_address, m.secret, m.tokenizer, {})
    c.stamp = {}
    await c.connect()
    rng = random.Random(0)
    res = [[] for _ in range(20)]
    k = 0
    async def conversation(record):
        nonlocal k
        conv = []
        for t in range(20):
            conv = conv + [rng.randrange(300, 3000) for _ in range(12)]
            await asyncio.sleep(think + (rng.uniform(0, 2 * JITTER) if JITTER else 0.0))
            k += 1
            rid = f"c{k}"
            t0, t0ns, first, toks = time.perf_counter(), time.time_ns(), None, []
            async for out in c.generate(EngineRequest(rid, conv, 8, temperature=0, ignore_eos=True)):
                if first is None:
                    first = time.perf_counter() - t0
                toks += out.token_ids
            got, infos = c.stamp.pop(rid)
            # the prefill step: the first info whose start is after the send
            step = next((i for i in infos if i.start_ns >= t0ns), infos[0])
            conv = conv + toks
            if record:
                res[t].append((1e3 * first, (step.start_ns - t0ns) / 1e6, (step.end_ns - step.start_ns) / 1e6,
                               step.batch_size))
    async def slot(i):
        await asyncio.sleep(i * 20 * (think + 0.004) / n)
        for j in range(convs_per_slot):
            await conversation(record=0 < j < convs_per_slot - 1)
    await asyncio.gather(*(slot(i) for i in range(n)))
    c.close()
    return res

JITTER = 0.0
if __name__ == "__main__":
    n, cps, think = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1e3
    JITTER = float(sys.argv[4]) / 1e3 if len(sys.argv) > 4 else 0.0
    print(f"{n} conversations at once, {cps} per slot (first and last not measured), before each turn {think*1e3:g} ms"
          + (f" + uniform [0, {2*JITTER*1e3:g}] ms" if JITTER else ""))
    with fast_ring() as ring:
        res = asyncio.run(measure(ring, n, cps, think))
    for t, xs in enumerate(res):
        cols = [statistics.median(c) for c in zip(*xs)]
        print(f"turn {t+1:2d}: first {cols[0]:.2f} send->step {cols[1]:.2f} step {cols[2]:.2f} batch {cols[3]:.1f}  (n={len(xs)})")
