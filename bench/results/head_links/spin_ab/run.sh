#!/bin/bash
# A/B of the fast lane's spin_us on the served warm WebSocket first token, one app per config.
cd /work/main
for cfg in "$@"; do
  nohup .venv/bin/fastmode up --port 18000 --config /tmp/ab/$cfg.yaml > /tmp/ab/up_$cfg.log 2>&1 &
  for i in $(seq 1 60); do sleep 5; grep -q "ready in" /tmp/ab/up_$cfg.log && break; done
  sleep 5
  echo "== $cfg $(date +%H:%M:%S)"
  for r in 1 2 3; do
    .venv/bin/python -m bench.gateway --url http://127.0.0.1:18000 --ttft-only --warm-only --trials 60 2>/dev/null \
      | python3 -c "import json,sys,statistics; xs=json.loads(sys.stdin.read()); print('warm ws p50 %.2f ms' % (1e3*statistics.median(xs)))"
    .venv/bin/python -m bench.turns --url http://127.0.0.1:18000 --rtt-ms '' --repeats 2 --lanes fast 2>/dev/null | grep "websocket  " 
  done
  pkill -INT -f "fastmode up --port 18000"; sleep 20; .venv/bin/ray stop --force >/dev/null 2>&1; pkill -9 -f VLLM::EngineCore; sleep 3
done
