#!/usr/bin/env bash
# Stop 44's device call: stop 43's owed runs in one call. First the paced spin's priority rounds
# (spin_call.sh: issue 33 item 5), then the floor with receives posted ahead on this host (issue
# 34's 8-byte edge), then every GPU test binary under BOUNDPOOL_REQUIRE_GPU=1 over the scheduler's
# paced spin (`e13a96b`..`8cd233d`). Here: `PACK_MPI=1 bash benches/device/pack.sh`, then with
# carry [".devbin"]: `bash .devbin/stop44_call.sh`.
cd "$(dirname "$0")/.."
TOTAL=${SPIN_TOTAL:-275} bash .devbin/spin_call.sh
source .devbin/lib.sh
deadline ${REST:-290}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
logs_in /tmp/bp-floor floor.tgz fresh
SUMMARY='panicked|Error'
step floor 45 mpirun --bind-to none -np 2 $B/bench_ranks --workers 2 --dag 0 --no-big --runs 3
grep -hE "^\| (8-byte|\(floor\))" $LOGS/floor.log | cut -c1-200
finish
logs_in /tmp/bp-tests tests.tgz fresh
SUMMARY='test result|FAILED|panicked|SKIPPED'
for t in $B/t_gpu_* $B/t_boundpool_gpu $B/t_prometheus_gpu; do
  n=$(basename $t); a=; [ $n = t_gpu_replay ] && a=--test-threads=1
  case $n in t_gpu_nccl|t_gpu_ranks_nccl) continue ;; esac
  step $n 60 $t $a; grep -hE "test result|FAILED|panicked" $LOGS/$n.log | head -4
done
finish
