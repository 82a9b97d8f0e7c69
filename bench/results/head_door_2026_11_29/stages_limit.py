"""Throwaway (2026-11-29): the same stages for the limit's path (the ring's blocking client, a Link), for
comparison with stages_door.py. Run: python bench/results/head_door_2026_11_29/stages_limit.py"""
import os, statistics, sys, time
sys.path.insert(0, "/work/main")
import ray
from tokenizers import Tokenizer
from bench.lanes_quick import TTFT_PROMPT
from models import FAST
from serve.config import FastLaneConfig
from serve.lanes.sharded_engine import ring_options
from sharding.pipeline import ShardedModel
from sharding.sampling import SamplingParams

def instrument(worker):
    import time
    from sharding import ring as R, transport as T
    log = worker._stagelog = []
    def wrap(cls, name, label=None):
        f = getattr(cls, name)
        def g(self, *a, **k):
            t = time.monotonic_ns()
            try:
                return f(self, *a, **k)
            finally:
                log.append((label or name, t, time.monotonic_ns()))
        setattr(cls, name, g)
    wrap(T.Link, "read_messages"); wrap(R.Head, "_step"); wrap(R.Head, "_send", "send")
    return True

def fetch(worker):
    log = list(worker._stagelog); worker._stagelog.clear(); return log

cfg = FastLaneConfig()
prompt = Tokenizer.from_file(str(FAST / "tokenizer.json")).encode(TTFT_PROMPT).ids
ray.init(address="local", resources={"chip": 1}, include_dashboard=False, log_to_driver=False)
with ShardedModel.from_pretrained(FAST, tp=1, pp=1, **ring_options(cfg)) as m:
    m.warmup()
    ray.get(m.head_worker.__ray_call__.remote(instrument))
    sends = []
    def go(n):
        for i in range(n):
            t = time.monotonic_ns()
            m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
            sends.append((t, time.monotonic_ns()))
    go(20); ray.get(m.head_worker.__ray_call__.remote(fetch)); sends.clear()
    go(100)
    log = ray.get(m.head_worker.__ray_call__.remote(fetch))
    stages = {k: [] for k in ["send->read_start", "read dur", "read_end->step_start", "step dur", "step_end->send_start", "send dur", "send_end->client", "total"]}
    for (t0, t1) in sends:
        reads = [e for e in log if e[0] == "read_messages" and t0 <= e[1] <= t1]
        if not reads: continue
        r = reads[0]
        steps = [e for e in log if e[0] == "_step" and e[1] >= r[2] and e[1] <= t1]
        if not steps: continue
        s = steps[0]
        outs = [e for e in log if e[0] == "send" and e[1] >= s[2] and e[1] <= t1]
        if not outs: continue
        o = outs[0]
        stages["send->read_start"].append(r[1] - t0); stages["read dur"].append(r[2] - r[1])
        stages["read_end->step_start"].append(s[1] - r[2]); stages["step dur"].append(s[2] - s[1])
        stages["step_end->send_start"].append(o[1] - s[2]); stages["send dur"].append(o[2] - o[1])
        stages["send_end->client"].append(t1 - o[2]); stages["total"].append(t1 - t0)
    for k, v in stages.items():
        print(f"{k:24s} p50 {statistics.median(v)/1e3:8.1f} us  (n={len(v)})")
ray.shutdown()
