P="Summarize this paragraph in two sentences, reusing its words: The old harbour town of Kelmouth sits at the mouth of a wide grey river. Its fishermen leave before dawn in small blue boats, and its market opens at noon, when the catch comes in. Visitors come for the market, the long stone pier and the lighthouse, which has guided ships into the river for three hundred years."
run() { local bin=$1; shift; echo "$(basename $bin) $* : $($bin generate --model /root/.cache/nuvec/speculative-f16-b179c9523d0e -m 128 --temp 0 -p "$P" "$@" 2>&1 | grep -E "Generation:|ccept" | tr '\n' ' ')"; }
for r in 1 2; do
run /tmp/nuvec-base
for k in 3 5; do run /tmp/nuvec-base --draft-model /root/.cache/nuvec/workload-mlx-b179c9523d0e --num-draft-tokens $k; run /tmp/nuvec-new --draft-model /root/.cache/nuvec/workload-mlx-b179c9523d0e --num-draft-tokens $k; done
run /tmp/nuvec-new
done
