#!/bin/bash
for round in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then root=/work/wt/old; else root=/work/main; fi
    flock /tmp/bench.lock $root/build/demo/examples/exit_latency 1 --reps 5 --busy 0 > demo.$v.$round.txt 2>&1
    flock /tmp/bench.lock $root/build/bench/benchmarks/exit_matrix --rows exit_breakdown --sizes 1 --reps 5 --out em.$v.$round.json > em.$v.$round.txt 2>&1
  done
done
echo finished
