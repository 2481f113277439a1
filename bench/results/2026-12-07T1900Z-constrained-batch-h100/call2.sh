#!/bin/bash
# Issue 26 at 64 concurrent, call 2: a step's constrained tokens taken into their grammars one
# after another (nuvec-new, cfaf95b) against all at once on the masks' pool (nuvec-commit), both
# with the prof branch's phase timers.
T0=$(date +%s); t() { echo "  t=$(( $(date +%s) - T0 )) s"; }
G=.gpu-run; chmod +x $G/nuvec-new $G/nuvec-commit; mkdir -p $OUT/raw /tmp/tk && tar -C /tmp/tk -xJf $G/llama3_1.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|Thread|Core\(s\)|Socket"
python3 scripts/make-random-checkpoint.py /tmp/m8b-l3 --shape 8b --seed 0 --vocab 128256 --tokenizer /tmp/tk/llama3_1 > /tmp/mk.log 2>&1 || tail -3 /tmp/mk.log
t
python3 - <<'PY'
import json, random
rng = random.Random(0)
requests = [{"arrival": 0.0, "max_tokens": 128, "prompt": [rng.randrange(100, 30000) for _ in range(512)]} for _ in range(64)]
json.dump({"concurrency": 64, "requests": requests}, open("/tmp/wc.json", "w"))
PY
SCHEMA=$(sed -n "s/^SCHEMA='\(.*\)'$/\1/p" bench/compare-constrained)
run() { # name, command...
  local name=$1; shift
  timeout 100 "$@" > $OUT/raw/$name.log 2>&1
  echo "$name: $(grep -oE 'generated=[0-9]+|throughput=[0-9.]+|waited [0-9.]+s' $OUT/raw/$name.log | head -3 | tr '\n' ' ')"; grep PROF $OUT/raw/$name.log | tail -1
}
for r in 1 2 3; do
  for b in new commit; do
    run $b-plain$r $G/nuvec-$b bench --device cuda --workload /tmp/wc.json --model /tmp/m8b-l3
    run $b-any$r $G/nuvec-$b bench --device cuda --workload /tmp/wc.json --model /tmp/m8b-l3 --regex '[^\x00]*'
    run $b-schema$r $G/nuvec-$b bench --device cuda --workload /tmp/wc.json --model /tmp/m8b-l3 --json-schema "$SCHEMA"
    t
    [ $(( $(date +%s) - T0 )) -gt 470 ] && break 2
  done
done
echo done
