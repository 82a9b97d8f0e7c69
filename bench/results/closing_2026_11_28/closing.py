import sys, time, json
sys.path.insert(0, "/work/main")
from tests.serve.conftest import App
from tests.conftest import SHARED_APP_CONFIG
from tests.serve.test_lanes import request, cancelled
from pathlib import Path
cfg = Path("/tmp/st/shared.yaml"); cfg.write_text(SHARED_APP_CONFIG)
a = App("--config", str(cfg), probe_first_requests=True)
try:
    fails = 0
    for i in range(int(sys.argv[1])):
        for lane in ("priority", "standard"):
            before = cancelled(a.lane_stats(lane))
            t0 = time.monotonic()
            with a.stream(**request(lane, "class Parser:\n", max_output_tokens=None)) as (status, events):
                assert next(events)["type"] == "created"
                t1 = time.monotonic()
                held = a.lane_stats(lane)
                t2 = time.monotonic()
                assert next(events)["type"] == "delta"
                t3 = time.monotonic()
            while (stats := a.lane_stats(lane))["running"] or stats["in_flight"]:
                time.sleep(0.2)
            t4 = time.monotonic()
            ok = cancelled(stats) == before + 1
            fails += not ok
            print(f"{i} {lane}: created {t1-t0:.3f} health {t2-t1:.3f} delta {t3-t2:.3f} freed {t4-t3:.3f} ok={ok}", flush=True)
    print("fails", fails)
finally:
    a.stop()
