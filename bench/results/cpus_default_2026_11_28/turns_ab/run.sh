#!/bin/bash
cd /work/main
for cfg in off auto auto off; do
  i=$((i+1))
  .venv/bin/ray stop --force >/dev/null 2>&1
  nohup .venv/bin/fastmode up --port 18000 --config /tmp/ab/$cfg.yaml > /tmp/ab/up_$i_$cfg.log 2>&1 &
  for t in $(seq 1 300); do grep -q "ready in" /tmp/ab/up_$i_$cfg.log && break; sleep 2; done
  echo "$i $cfg $(grep -o 'ready in.*' /tmp/ab/up_$i_$cfg.log) $(date +%T)"
  sleep 15
  .venv/bin/fastmode bench turns --url http://127.0.0.1:18000 --rtt-ms '' --json /tmp/ab/turns_${i}_$cfg.json > /tmp/ab/turns_${i}_$cfg.log 2>&1
  echo "$i $cfg done $(date +%T)"
  pkill -INT -f "fastmode up --port 18000"; sleep 20; .venv/bin/ray stop --force >/dev/null 2>&1; sleep 3
done
echo ALLDONE
