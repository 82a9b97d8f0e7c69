"""Throwaway: the priority lane's engine in process, one conversation at a time, 20 turns of one held-out
line each (8 greedy tokens out, 10 ms between turns): first token per turn with vLLM sessions
(serve/lanes/vllm_sessions.py) against plain requests (prefix cache only), alternated; outputs compared."""
import asyncio, json, statistics, sys, time
sys.path.insert(0, "/work/main")


async def main():
    from tokenizers import Tokenizer
    from bench.turns import conversation_inputs
    from models import FULL
    from serve.config import PriorityLaneConfig, StandardLaneConfig
    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine

    lane = sys.argv[1] if len(sys.argv) > 1 else "priority"
    tok = Tokenizer.from_file(str(FULL / "tokenizer.json"))
    eng = VLLMLaneEngine(FULL, (PriorityLaneConfig if lane == "priority" else StandardLaneConfig)())
    sessions = eng.sessions
    convs = conversation_inputs(8, 20)

    async def run(tag, lines):
        ids, ttft, outs, cached = [], [], [], []
        for k, line in enumerate(lines):
            ids = ids + tok.encode(("\n" if k else "") + line, add_special_tokens=False).ids
            t0 = time.perf_counter(); first = None; out = []
            async for o in eng.generate(EngineRequest(f"{tag}-{k}", list(ids), 8, temperature=0, ignore_eos=True,
                                                      continues=k > 0)):
                if first is None:
                    first = time.perf_counter(); cached.append(o.cached_tokens)
                out += o.token_ids
            ttft.append(first - t0); outs.append(out); ids = ids + out
            await asyncio.sleep(0.01)
        await sessions.close_all()
        return ttft, outs, cached

    await run("warm", convs[0][:4])
    res = {"session": [], "plain": []}
    for r, lines in enumerate(convs):
        for name in (["session", "plain"] if r % 2 == 0 else ["plain", "session"]):
            eng.sessions = sessions if name == "session" else None
            res[name].append(await run(f"{name}{r}", lines))
    eng.sessions = sessions
    out = {}
    for name, rs in res.items():
        t1 = statistics.median(x[0][0] for x in rs) * 1e3
        t20 = statistics.median(x[0][-1] for x in rs) * 1e3
        later = statistics.median(statistics.median(x[0][2:]) for x in rs) * 1e3
        out[name] = {"turn1_ms": t1, "turn20_ms": t20, "turns3_20_median_ms": later, "ratio": t20 / t1,
                     "per_turn_ms": [statistics.median(x[0][k] for x in rs) * 1e3 for k in range(20)],
                     "cached_last": [x[2][-1] for x in rs]}
        print(f"{lane} {name:8s} turn1 {t1:.2f} ms  turns 3-20 {later:.2f}  turn20 {t20:.2f}  turn20/turn1 {t20/t1:.2f}"
              f"  cached at turn 20 {out[name]['cached_last']}", flush=True)
    same = [a[1] == b[1] for a, b in zip(res["session"], res["plain"])]
    print("outputs equal per conversation:", same)
    out["outputs_equal"] = same
    json.dump(out, open(f"/tmp/exp/session_exp_{lane}.json", "w"), indent=1)
    eng.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
