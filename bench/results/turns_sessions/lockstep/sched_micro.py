import time, random, statistics, pickle
from models import FAST
from sharding.weights import load_model
from sharding.scheduler import Scheduler, validate_request
from sharding.kv_cache import SlotPool
from sharding.sampling import SamplingParams
from sharding.transport import frame
if __name__ == "__main__":
    cfg = load_model(FAST).config
    rng = random.Random(0)
    for L in (13, 391):
        hist = [rng.randrange(300, 3000) for _ in range(L - 12)]
        s = Scheduler(cfg, SlotPool(8), 512, prefix_cache=True)
        for i in range(8):
            s.prefix.park(s.slots.allocate(), [rng.randrange(300, 3000) for _ in range(300)])
        prompt = hist + [rng.randrange(300, 3000) for _ in range(12)]
        p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        ts = {"validate": [], "frame+loads": [], "add": [], "schedule": []}
        for n in range(300):
            # re-park the history in slot 0
            s.prefix._slots.pop(0, None); s.prefix.park(0, list(hist))
            t = time.perf_counter(); validate_request(cfg, 512, "r", prompt, p); ts["validate"].append(time.perf_counter() - t)
            t = time.perf_counter(); b = frame(("add", f"r{n}", prompt, p)); pickle.loads(b[8:]) if False else None; ts["frame+loads"].append(time.perf_counter() - t)
            t = time.perf_counter(); s.add(f"r{n}", prompt, p); ts["add"].append(time.perf_counter() - t)
            t = time.perf_counter(); batch = s.schedule(); ts["schedule"].append(time.perf_counter() - t)
            s.abort(f"r{n}"); s._freed.clear()
        print(L, {k: round(1e6 * statistics.median(v), 1) for k, v in ts.items()}, "cached", s.prefix.reused_tokens // 300)
