#!/bin/bash
# Session 46, call 2: a MoE layer's residual add and next norm folded into its down launch
# (moe_down_*_int_norm). Tests, then base (693a08b) against this build alternated on 12-layer
# A3B and gpt-oss GGUF copies, then ncu of the MoE kernels of a 2-layer A3B.
cd "$(dirname "$0")/.."
T0=$(date +%s); left() { echo $((${BUDGET:-300} - ($(date +%s) - T0))); }
B=/tmp/b; mkdir -p $B /tmp/tok /tmp/fx && tar -C $B -xJf .gpu-run/bins.tar.xz && tar -C /tmp/tok -xJf .gpu-run/tok.tar.xz && tar -C /tmp/fx -xJf .gpu-run/fx.tar.xz
export WORK=/tmp/gb; mkdir -p $WORK $OUT/raw
SRC=$(bench/llama-cpp source)
g() { (PYTHONPATH=$SRC/gguf-py python3 bench/make_gguf_random.py $WORK/$1.part --arch $2 --layers $3 --tokenizer /tmp/tok/$4 > /dev/null 2>&1 && mv $WORK/$1.part $WORK/$1.gguf) & }
g a3b12 qwen3-30b-a3b 12 qwen3; g oss12 gpt-oss-20b 12 gptoss; g a3b2 qwen3-30b-a3b 2 qwen3
export NUVEC_GPU_FIXTURES=/tmp/fx
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local s=$1; shift; echo "== $* (left $(left) s)"; (cd $B && timeout $s "$@" 2>&1 | grep -E "^test .*(FAIL|ok$)|test result|panicked|assert|FAIL|left:|right:|MISMATCH" | head -30); }
t 120 ./cuda_moe --test-threads=2
t 60 ./gpu_parity --test-threads=1 --exact gguf_qwen3_moe_model gguf_gpt_oss_model
t 50 ./cuda_ops --test-threads=2 decode_fusions linear_add_rms_norm
wait; echo "ggufs ready (left $(left) s)"
b() { local e=$1 m=$2 tag=$3; shift 3; local s0=$(date +%s)
  timeout 100 $B/$e bench --model $m --device cuda "$@" > $OUT/raw/$e-$tag.log 2>&1
  echo "$e $tag: $(grep -oE 'generation_tps=[0-9.]*' $OUT/raw/$e-$tag.log | tail -1) $(grep -oE 'decode [0-9.]* ms/token with graphs' $OUT/raw/$e-$tag.log) ($(( $(date +%s) - s0 )) s) $(grep -iE 'error|panick' $OUT/raw/$e-$tag.log | head -2)"; }
for r in 1 2; do for m in a3b12 oss12; do for e in nuvec-base nuvec; do [[ $(left) -lt 60 ]] && break 3; b $e $WORK/$m.gguf $m-r$r -p 512 -g 128 -n 1; done; done; done
for e in nuvec-base nuvec; do [[ $(left) -lt 40 ]] && break
  NUVEC_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none --csv -k regex:'moe_|add_rms_norm|qgemv' --metrics gpu__time_duration.sum \
    $B/$e bench --model $WORK/a3b2.gguf --device cuda -p 32 -g 8 -n 1 > $OUT/raw/ncu-$e.csv 2> $OUT/raw/ncu-$e.err
  python3 - $OUT/raw/ncu-$e.csv $e <<'P'
import csv,io,sys,collections
t=open(sys.argv[1]).read().splitlines(); i=[k for k,l in enumerate(t) if l.startswith('"ID"')]
rows=list(csv.DictReader(io.StringIO("\n".join(t[i[0]:])))) if i else []
d=collections.defaultdict(list)
for r in rows: d[r['Kernel Name']].append(float(r['Metric Value'].replace(',','')))
print(sys.argv[2], {k:(len(v), round(sorted(v)[len(v)//2]/1000,2)) for k,v in d.items()})
P
done
echo "left $(left) s"; echo done
