#!/bin/bash
cd /work/main
move() { for p in $(pgrep -f VLLM::EngineCore); do for t in /proc/$p/task/*; do c=$(cat $t/comm); if [ "$c" = gloo_tcp_loop ]; then taskset -p -c $1 $(basename $t) >/dev/null; fi; done; done; }
for r in 1 2 3; do
 for v in 0 1; do
  move $v
  .venv/bin/python -m bench.cpu_profile --url ws://127.0.0.1:18000 --lane standard --streams 32 --requests-per-stream 12 > /tmp/gab_${r}_$v.txt 2>&1
  echo "round $r gloo-on-cpu $v: $(grep -o '[0-9]* tok/s' /tmp/gab_${r}_$v.txt)"
 done
done
move 0
