#!/bin/bash
for r in 1 2; do for v in old new; do
  if [ $v = old ]; then root=/work/wt/old; else root=/work/main; fi
  flock /tmp/bench.lock timeout 280 $root/build/bench/benchmarks/reaper_bench --benchmark_filter='enqueue_awake|^drain/reaper/|^drain/reaper_poll' --benchmark_out=reaper_bench.$v.$r.json --benchmark_out_format=json > /dev/null 2>&1
  flock /tmp/bench.lock timeout 280 $root/build/bench/benchmarks/llist_bench --benchmark_filter='^llist/std|^sharded_llist/std|^consumer_bound/(llist|sharded_llist)/std/producers' --benchmark_out=llist_bench.$v.$r.json --benchmark_out_format=json > /dev/null 2>&1
done; done; echo finished > done
