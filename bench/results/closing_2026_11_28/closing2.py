import sys, time, json
sys.path.insert(0, "/work/main")
from tests.serve.conftest import App
from tests.conftest import SHARED_APP_CONFIG
from tests.serve.test_lanes import request, cancelled
from pathlib import Path
import httpx
cfg = Path("/tmp/st/shared.yaml"); cfg.write_text(SHARED_APP_CONFIG)
a = App("--config", str(cfg), probe_first_requests=True)
try:
    for i in range(int(sys.argv[1])):
        lane = "priority"
        before = cancelled(a.lane_stats(lane))
        with a.stream(**request(lane, "class Parser:\n", max_output_tokens=None)) as (status, events):
            assert next(events)["type"] == "created"
            time.sleep(float(sys.argv[3]))
            n = 0
            for ev in events:
                n += 1
                if n >= int(sys.argv[2]): break
            t3 = time.monotonic()
        trace = []
        while True:
            s = a.lane_stats(lane)
            trace.append((round(time.monotonic() - t3, 3), s["in_flight"], s["running"], cancelled(s) - before))
            if not s["running"] and not s["in_flight"]:
                break
            time.sleep(0.02)
        print(i, "events read", n, "first", trace[0], "last", trace[-1], "n", len(trace), flush=True)
finally:
    a.stop()
