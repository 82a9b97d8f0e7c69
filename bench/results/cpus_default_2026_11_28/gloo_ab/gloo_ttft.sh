#!/bin/bash
cd /work/main
move() { for p in $(pgrep -f VLLM::EngineCore); do for t in /proc/$p/task/*; do c=$(cat $t/comm); if [ "$c" = gloo_tcp_loop ]; then taskset -p -c $1 $(basename $t) >/dev/null; fi; done; done; }
for r in 1 2 3; do
 for v in 0 1; do
  move $v
  .venv/bin/python -m bench.gateway --url http://127.0.0.1:18000 --ttft-only --warm-only --trials 60 > /tmp/gt_${r}_$v.json 2>/tmp/gt_err
  .venv/bin/python -c "
import json,statistics,sys
d=json.load(open('/tmp/gt_${r}_$v.json'))
xs = d if isinstance(d,list) else d.get('warm', d)
print('round $r gloo-on-cpu $v p50 ms', round(statistics.median(xs)*1000,3), len(xs))"
 done
done
move 0
