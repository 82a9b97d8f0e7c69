"""Throwaway (2026-11-29): a ring with a door in this process, no app; split.py run against it 3 times.
Run: python bench/results/door_client_2026_11_29/ringdoor.py"""
import os, sys, time, subprocess
sys.path.insert(0, "/work/main")
import ray
from models import FAST
from serve.config import FastLaneConfig
from serve.lanes.door import DoorSpec
from serve.lanes.sharded_engine import resolve_layout, ring_options
from sharding.pipeline import ShardedModel
cfg = FastLaneConfig()
tp, pp, _ = resolve_layout(FAST, cfg, os.cpu_count() or 1)
spec = DoorSpec(model_id="fastmode-fast", model_path=str(FAST), price=1.0, host="127.0.0.1")
ray.init(address="local", resources={"chip": tp * pp}, include_dashboard=False, log_to_driver=False)
with ShardedModel.from_pretrained(FAST, tp=tp, pp=pp, **ring_options(cfg), door=spec) as m:
    m.warmup()
    url = f"ws://{m.door_address[0]}:{m.door_address[1]}/v1/responses"
    for i in range(3):
        subprocess.run([sys.executable, str(__import__("pathlib").Path(__file__).with_name("split.py")), url, "200"])
ray.shutdown()
