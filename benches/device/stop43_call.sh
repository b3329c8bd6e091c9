#!/usr/bin/env bash
# Stop 43's first device call: stop 42's owed call (stop42_call.sh: the launch probe's GPU test,
# a `--tail-probe` round, the 8-byte edge A/B), a second `--tail-probe` round (the bf16 cell misses
# in some rounds only), then every GPU test binary under BOUNDPOOL_REQUIRE_GPU=1 (the launch
# probe touched the replay and GPU-node paths). Here: `PACK_MPI=1 bash benches/device/pack.sh`
# (and the base build stop42_call.sh names), then with carry [".devbin"]:
# `bash .devbin/stop43_call.sh`.
# From the repository root, where stop42_call.sh and lib.sh expect to start.
cd "$(dirname "$0")/.."
TOTAL=125 bash .devbin/stop42_call.sh
source .devbin/lib.sh
deadline ${REST:-200}
logs_in /tmp/bp-ta2 ta2.tgz fresh
SUMMARY='panicked|Error'
step probe2 48 $B/bench_serve --tail-probe --seconds 1 --batch-clients 32,8 --isolate high --high-partition 16 --no-torch
grep -hE "^\||beside|alone" $LOGS/probe2.log | cut -c1-420
finish
logs_in /tmp/bp-tests tests.tgz fresh
SUMMARY='test result|FAILED|panicked|SKIPPED'
for t in $B/t_gpu_* $B/t_boundpool_gpu $B/t_prometheus_gpu; do
  n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1
  case $n in t_gpu_nccl|t_gpu_ranks_nccl) continue ;; esac
  step $n 60 $t $a; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -4
done
finish
