#!/usr/bin/env bash
# GPU-machine calls for SM partitions (issue "SM partitions"). Here, first:
#   bash benches/device/pack.sh
# then, with carry [".devbin"], from the repository root:
#   bash .devbin/partition_call.sh          every GPU test, memcheck over the partition and
#                                           replay-run tests, the CLI with --partitions, and
#                                           bench_partition with its PyTorch peer (about 5 min;
#                                           PART_ARGS replaces its arguments)
#   PART=2 bash .devbin/partition_call.sh   the Cholesky partition sweep and a 60 s GPU soak
# Logs: $OUT/logs.tgz.
source "$(dirname "$0")/lib.sh"
export CUDA_DEVICE_MAX_CONNECTIONS=32
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${PART:-1}" = 1 ]; then
  for t in $(cd $B && ls t_*); do step $t 150 $B/$t --test-threads=1; done; finish
  step memcheck_partitions 120 $CS $B/t_gpu_partitions --test-threads=1
  step memcheck_replay_runs 120 $CS $B/t_gpu_replay_runs --test-threads=1; finish
  step cli_run 60 $B/boundpool run --gpu --shape wavefront --size 1000 --repeat 5 --partitions latency:8:1,bulk:rest:3
  head -n 4 $LOGS/cli_run.log
  step cli_latency 90 $B/boundpool bench --latency --gpu --seconds 1 --partitions latency:16:2,bulk:rest:4
  tail -n 16 $LOGS/cli_latency.log; finish
  (cd .. && step bench_partition 240 $B/bench_partition ${PART_ARGS:---seconds 3 --json})
  grep -vE '^\{' $LOGS/bench_partition.log | tail -n 14; grep -E '"scenario"' $LOGS/bench_partition.log; finish
else
  (cd .. && step chol_part ${CHOL_S:-200} $B/bench_cholesky --n 8192,16384 --tiles 1024,2048 --runs 2 --partition-sms ${CHOL_PART_SMS:-16,32,64})
  tail -n 40 $LOGS/chol_part.log; finish
  step soak 100 $B/boundpool soak --gpu --seconds 60; tail -n 6 $LOGS/soak.log; finish
fi
