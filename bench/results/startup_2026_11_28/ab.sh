#!/bin/bash
cd /work/main
FILES="cluster/cpus.py sharding/worker.py sharding/pipeline.py serve/lanes/speculative_engine.py serve/up.py"
stop() { pkill -INT -f "fastmode up" ; sleep 12; pkill -9 -f VLLM::EngineCore; .venv/bin/ray stop --force >/dev/null 2>&1; sleep 3; }
for v in ${ORDER:-new old old new}; do
  if [ $v = old ]; then git checkout -q HEAD~1 -- $FILES; else git checkout -q HEAD -- $FILES; fi
  n=$(ls /tmp/st/ab_${v}_*.log 2>/dev/null | wc -l)
  timeout 400 .venv/bin/python /tmp/st/startup_cpu.py /tmp/st/ab_${v}_$n.log > /tmp/st/ab_${v}_${n}_cpu.txt 2>&1
  echo "$v $n: $(grep 'ready in' /tmp/st/ab_${v}_$n.log)"
  stop
done
git checkout -q HEAD -- $FILES
git status --short
