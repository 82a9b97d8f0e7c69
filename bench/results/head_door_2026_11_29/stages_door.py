"""Throwaway (2026-11-29): each stage of a warm first token in the head chip, through the door (serve.lanes.door), timed by
wrapping the head's and the door's methods in the chip's process (__ray_call__); one-chip ring in process, no app.
The wrappers add their own few microseconds to every stage. Run: python bench/results/head_door_2026_11_29/stages_door.py"""
import asyncio, os, statistics, sys, time
sys.path.insert(0, "/work/main")
import ray, uvloop
from tokenizers import Tokenizer
from websockets.asyncio.client import connect
from bench.gateway import ws_response
from bench.lanes_quick import TTFT_PROMPT
from models import FAST
from serve.config import FastLaneConfig
from serve.lanes.door import DoorSpec
from serve.lanes.sharded_engine import resolve_layout, ring_options
from sharding.pipeline import ShardedModel
from sharding.sampling import SamplingParams

def instrument(worker):
    import time
    from serve.lanes import door as D
    from sharding import ring as R
    log = worker._stagelog = []
    def wrap(cls, name):
        f = getattr(cls, name)
        def g(self, *a, **k):
            t = time.monotonic_ns()
            try:
                return f(self, *a, **k)
            finally:
                log.append((name, t, time.monotonic_ns()))
        setattr(cls, name, g)
    from websockets.server import ServerProtocol
    from serve.request import GenerateRequest
    from sharding.scheduler import Scheduler
    for cls, name in [(D.DoorConnection, "read_messages"), (D.DoorConnection, "send"), (R.Head, "_step"),
                      (R.Head, "_flush"), (D.DoorConnection, "_create"), (D.DoorConnection, "write"), (R.Head, "_wait"),
                      (D.DoorConnection, "_outputs"), (D.DoorConnection, "_frame"), (ServerProtocol, "receive_data"),
                      (ServerProtocol, "events_received"), (D.DoorConnection, "_completed"), (D.DoorConnection, "_queue"),
                      (Scheduler, "add"), (Scheduler, "schedule"), (R.Head, "_apply")]:
        wrap(cls, name)
    gp = GenerateRequest.parse.__func__
    def parse(cls, *a, **k):
        t = time.monotonic_ns()
        try:
            return gp(cls, *a, **k)
        finally:
            log.append(("parse", t, time.monotonic_ns()))
    GenerateRequest.parse = classmethod(parse)
    def timed(label, f):
        def g(*a, **k):
            t = time.monotonic_ns()
            try:
                return f(*a, **k)
            finally:
                log.append((label, t, time.monotonic_ns()))
        return g
    D.validate_request = timed("validate", D.validate_request)
    D.TextStream = timed("TextStream", D.TextStream)
    D.SamplingParams = timed("SamplingParams", D.SamplingParams)
    D._Response = timed("_Response", D._Response)


    return True

def fetch(worker):
    log = list(worker._stagelog); worker._stagelog.clear(); return log

cfg = FastLaneConfig()
spec = DoorSpec(model_id="fastmode-fast", model_path=str(FAST), price=1.0, host="127.0.0.1")
prompt = Tokenizer.from_file(str(FAST / "tokenizer.json")).encode(TTFT_PROMPT).ids
loop = uvloop.new_event_loop()
ray.init(address="local", resources={"chip": 1}, include_dashboard=False, log_to_driver=False)
with ShardedModel.from_pretrained(FAST, tp=1, pp=1, **ring_options(cfg), door=spec) as m:
    m.warmup()
    ray.get(m.head_worker.__ray_call__.remote(instrument))
    m.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    url = f"ws://{m.door_address[0]}:{m.door_address[1]}/v1/responses"
    conn = loop.run_until_complete(connect(url))
    sends = []
    async def go(n):
        for i in range(n):
            t = time.monotonic_ns()
            first, _, _ = await ws_response(conn, f"d{i}", "fastmode-fast", None, 4)
            sends.append((t, t + int(first * 1e9)))
    loop.run_until_complete(go(20))
    ray.get(m.head_worker.__ray_call__.remote(fetch)); sends.clear()
    loop.run_until_complete(go(100))
    log = ray.get(m.head_worker.__ray_call__.remote(fetch))
    # per request: client send -> read_messages start/end -> step start/end (first step after) -> send end(first write) -> client first
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
    from collections import defaultdict
    per = defaultdict(list)
    for name, a, b in log:
        per[name].append(b - a)
    for name, v in per.items():
        print(f"  call {name:18s} p50 {statistics.median(v)/1e3:8.1f} us (n={len(v)})")
ray.shutdown()
