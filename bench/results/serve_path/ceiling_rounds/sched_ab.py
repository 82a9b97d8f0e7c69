"""Throwaway: the 32-stream ceiling with the app's non-engine threads SCHED_NORMAL (A), SCHED_BATCH (B),
or the app's engine-core threads at nice -5 (C)."""
import asyncio, json, os, statistics, subprocess, sys, time
sys.path.insert(0, "/work/main")
from bench.gateway import ws_aggregate

URL = "http://127.0.0.1:18000"

def app_pids():
    out = {}
    for line in subprocess.run(["ps", "-eo", "pid,ni,args"], capture_output=True, text=True).stdout.splitlines()[1:]:
        pid, ni, args = line.split(None, 2)
        if any(k in args for k in ("ray::", "gcs_server", "raylet", "dashboard", "fastmode up", "runtime_env", "log_monitor", "VLLM::")) \
                and int(pid) != os.getpid() and "sched_ab" not in args:
            out[int(pid)] = (int(ni), args[:60])
    return out

ORIG = app_pids()
ENGINES = {int(p) for p in subprocess.run(["pgrep", "-f", "VLLM::EngineCore"], capture_output=True, text=True).stdout.split()}
print("engines", ENGINES, "others", len(ORIG) - len(ENGINES), flush=True)
for p in ORIG:
    try:
        print(p, open(f"/proc/{p}/autogroup").read().strip(), ORIG[p][1][:40])
    except OSError:
        pass

def tids(pid):
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []

def setmode(k):
    for pid in ORIG:
        for t in tids(pid):
            try:
                if pid in ENGINES:
                    os.setpriority(os.PRIO_PROCESS, t, -5 if k == "C" else 0)
                else:
                    pol = os.SCHED_BATCH if k == "B" else os.SCHED_OTHER
                    os.sched_setscheduler(t, pol, os.sched_param(0))
            except OSError:
                pass

async def main():
    from serve.config import StandardLaneConfig
    from serve.lanes.engine import EngineRequest
    from serve.lanes.vllm_engine import VLLMLaneEngine
    from models import FULL
    engine = VLLMLaneEngine(FULL, StandardLaneConfig())
    async def one(rid):
        n = 0
        async for o in engine.generate(EngineRequest(rid, [0, 100, 200], 256, temperature=0, ignore_eos=True)):
            n += len(o.token_ids)
        return n
    async def inproc(r):
        s = time.perf_counter(); t = sum(await asyncio.gather(*(one(f"c{r}-{i}") for i in range(32))))
        return t / (time.perf_counter() - s)
    await inproc(-1)
    res = {"A": [], "B": [], "C": []}
    order = sys.argv[1] if len(sys.argv) > 1 else "ABCCBAABC"
    for r, k in enumerate(order):
        setmode(k)
        await asyncio.sleep(1)
        if r % 2:
            s = await ws_aggregate(URL, None, 256, 32); i = await inproc(r)
        else:
            i = await inproc(r); s = await ws_aggregate(URL, None, 256, 32)
        res[k].append((s, i, s / i))
        print(k, f"served {s:.0f} in-process {i:.0f} ratio {s/i:.3f}", flush=True)
    setmode("A")
    engine.shutdown()
    for k, v in res.items():
        if v:
            print(k, "median ratio", statistics.median(x[2] for x in v), "served", statistics.median(x[0] for x in v),
                  "inproc", statistics.median(x[1] for x in v))
    json.dump(res, open("/tmp/exp/sched_ab.json", "w"))

if __name__ == "__main__":
    asyncio.run(main())
